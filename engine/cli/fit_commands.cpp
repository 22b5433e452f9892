// engine plan's budgets and --fit: every memory-saving configuration of the recipe against the
// host-memory and swap budgets, and the fastest that fits as a command line (trainer/fit.h).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <system_error>

#include "cli/commands.h"
#include "core/device_info.h"
#include "core/memory_limit.h"
#include "trainer/fit.h"
#include "trainer/progress_line.h"

namespace engine::cli {

using namespace engine::recipe;
namespace fs = std::filesystem;

namespace {

std::string budget_text(int64_t bytes) { return bytes == kUnlimitedBytes ? "unlimited" : format_bytes(bytes); }

// A word the shell passes through as written; anything else goes in single quotes.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word[0] != '~' && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./=:+-,@%", c);
  });
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string fits_text(const FitRow& row, const FitBudgets& b) {
  if (row.fits(b)) return "yes";
  if (row.fits_when_streamed(b)) return "with checkpoint.async=false";
  std::string missed;
  for (auto [fits, name] : {std::pair{row.host_proposed(b) <= b.host, "host"}, std::pair{row.fits_device(b), "device"},
                            std::pair{row.fits_nvme(b), "nvme"}})
    if (!fits) missed += std::string(missed.empty() ? "" : ", ") + name;
  return "no: " + missed;
}

std::string describe(const FitRow& row, bool layouts) {
  char text[200];
  std::snprintf(text, sizeof text, "%s%sstage %d, offload %s, activation checkpointing %s, micro-batch %lld x %lld",
                layouts ? "layout T x P x D " : "", layouts ? (row.layout_name() + ", ").c_str() : "", row.stage,
                row.offload_name().c_str(), policy_name(row.policy), (long long)row.micro, (long long)row.accumulation);
  return text;
}

// What `row` needs; a proposal (`proposed`) that fits only with checkpoint.async=false, with it.
std::string needs(const FitRow& row, const FitBudgets& b, bool proposed = false) {
  const bool streamed = proposed && row.proposes_streamed_checkpoints(b);
  return format_bytes(streamed ? row.host_needed_streamed : row.host_needed) + " of host memory" +
         (streamed ? " with checkpoint.async=false, no checkpoint snapshot held" : "") + " (budget " +
         budget_text(b.host) + ")" +
         (row.device
              ? ", " + format_bytes(row.device) + " of device memory per GPU (budget " + budget_text(b.device) + ")"
              : "") +
         (row.swap_needed ? ", " + format_bytes(row.swap_needed) + " of swap (budget " + budget_text(b.nvme) + ")"
                          : "");
}

FitBudgets budgets_from(const FitArgs& args, const FitSearch& search, std::ostream& out) {
  FitBudgets b;
  if (!args.host_memory.empty()) {
    b.host = parse_byte_size(args.host_memory, "--host-memory");
    b.host_source = "--host-memory";
  } else if (const MemoryLimit limit = memory_limit(); limit.known()) {
    b.host = limit.bytes;
    b.host_source = limit.describe();
  } else {
    b.host_source = "no memory limit found";
  }
  if (args.device_memory == "auto") {
    if (!search.device)
      throw UserError(
          "--device-memory auto: this run trains on the CPU (run.device), which has no "
          "device memory of its own; give a size to budget host memory");
    // The tightest of the GPUs the ranks take (local rank r: GPU r mod the GPUs here).
    const int used = std::min(cuda_device_count(), search.world);
    b.device = kUnlimitedBytes;
    for (int d = 0; d < used; ++d) b.device = std::min(b.device, cuda_device_free_bytes(d));
    if (used <= 0 || b.device <= 0) throw UserError("--device-memory auto: no CUDA device here to read; give a size");
    b.device_source = "free on " + cuda_device_name(0) +
                      (used > 1 ? " (the least of " + std::to_string(used) + ")" : "") + " now (cudaMemGetInfo)";
    if (search.ranks_per_device > 1)
      b.device_source += "; " + std::to_string(search.ranks_per_device) + " ranks share each GPU";
  } else if (!args.device_memory.empty() && search.device) {
    b.device = parse_byte_size(args.device_memory, "--device-memory");
    b.device_source = "--device-memory";
  } else if (!args.device_memory.empty()) {
    const int64_t device = parse_byte_size(args.device_memory, "--device-memory");
    out << "note: this run trains on the CPU (run.device): the device is the host, so --device-memory is a host "
           "budget\n";
    if (args.host_memory.empty() || device < b.host) {
      b.host = device;
      b.host_source = "--device-memory";
    }
  } else if (search.device) {
    b.device_source = "no device budget given (--device-memory SIZE or auto)";
  }
  if (!args.nvme.empty()) {
    b.nvme = parse_byte_size(args.nvme, "--nvme");
    b.nvme_source = "--nvme";
  } else {
    std::error_code error;
    const fs::space_info space = fs::space(search.nvme_path, error);
    if (!error) {
      b.nvme = int64_t(std::min<uintmax_t>(space.available, uintmax_t(kUnlimitedBytes)));
      b.nvme_source = "free space of " + search.nvme_path.string();
    } else {
      b.nvme_source = search.nvme_path.string() + ": " + error.message() + "; no limit assumed";
    }
  }
  return b;
}

void print_table(const FitSearch& search, const FitBudgets& b) {
  const bool ranks = search.world > 1;
  std::printf(" ");
  if (search.layouts) std::printf(" %-11s", "T x P x D");
  std::printf(" %-5s %-26s %-9s %9s %10s %10s", "stage", "offload", "ckpt", "micro", "host", "needed");
  if (ranks) std::printf(" %10s", "sent/step");
  if (search.device) std::printf(" %10s %10s", "device", "link/step");
  std::printf(" %10s %10s %10s %8s  %s\n", "swap", "swap/step", "recompute", "s/step", "fits");
  for (const FitRow& row : search.rows) {
    const std::string micro = std::to_string(row.micro) + "x" + std::to_string(row.accumulation);
    std::printf("%s", row.is_recipe ? "*" : " ");
    if (search.layouts) std::printf(" %-11s", row.layout_name().c_str());
    std::printf(" %-5d %-26s %-9s %9s %10s %10s", row.stage, row.offload_name().c_str(), policy_name(row.policy),
                micro.c_str(), format_bytes(row.host).c_str(), format_bytes(row.host_needed).c_str());
    if (ranks) std::printf(" %10s", format_bytes(row.sent).c_str());
    if (search.device)
      std::printf(" %10s %10s", format_bytes(row.device).c_str(), format_bytes(row.link_moved).c_str());
    std::printf(" %10s %10s %10.3g %8.3g  %s\n", format_bytes(row.swap).c_str(), format_bytes(row.swap_moved).c_str(),
                row.extra_flops, row.seconds, fits_text(row, b).c_str());
  }
}

}  // namespace

void print_fit(const RecipeArgs& args, const FitArgs& fit, const LoadedRecipe& loaded) {
  CostModel cost;
  const bool device = planned_for_cuda(loaded.recipe);
  if (device) {
    cost.flops_per_second = CostModel::device_flops_per_second(
        loaded.recipe.precision.mode == PrecisionMode::fp32 ? DType::f32 : DType::bf16);
    cost.interconnect_bytes_per_second = CostModel::device_interconnect_bytes_per_second;
  }
  if (fit.flops_per_second > 0) cost.flops_per_second = fit.flops_per_second;
  if (!fit.swap_bandwidth.empty()) {
    cost.swap_bytes_per_second = double(parse_byte_size(fit.swap_bandwidth, "--swap-bandwidth"));
    if (cost.swap_bytes_per_second <= 0) throw UserError("--swap-bandwidth " + fit.swap_bandwidth + ": must be > 0");
  }
  // Parse the budgets before the search, so that a typo is reported at once.
  const std::pair<std::string, const char*> sizes[] = {
      {fit.host_memory, "--host-memory"}, {fit.device_memory, "--device-memory"}, {fit.nvme, "--nvme"}};
  for (const auto& [text, what] : sizes)
    if (!text.empty() && text != "auto") parse_byte_size(text, what);
  const FitSearch search = fit_rows(args.recipe, args.load_options(), loaded, cost);
  const FitBudgets b = budgets_from(fit, search, std::cout);
  const int world = int(loaded.world.size);

  std::cout << "\nfitting to the machine (" << (world > 1 ? std::to_string(world) + " ranks on it" : "one rank")
            << "):\n  host memory  " << budget_text(b.host) << "  (" << b.host_source << ")\n";
  if (search.device)
    std::cout << "  device       " << budget_text(b.device) << " per GPU  (" << b.device_source << ")\n";
  std::cout << "  nvme swap    " << budget_text(b.nvme) << "  (" << b.nvme_source << ")\n";
  std::printf("  cost model   s/step = FLOPs per step / %.3g FLOP/s + swap bytes moved per step / %.3g B/s\n",
              cost.flops_per_second, cost.swap_bytes_per_second);
  if (world > 1)
    std::printf("               + bytes sent per step / %.3g B/s%s\n", cost.interconnect_bytes_per_second,
                search.layouts ? "; FLOPs x (M + P - 1) / M with P pipeline stages over M micro-batches" : "");
  if (search.device)
    std::printf("               + (staged GPU runs) link bytes per step / %.3g B/s + the host's update / %.3g B/s\n",
                cost.link_bytes_per_second, cost.host_update_bytes_per_second);
  std::printf("\n");
  print_table(search, b);
  std::cout << "  (* the recipe as given; host: MemoryPlan total per rank (the heaviest stage's); needed: with the\n"
               "   checkpoint snapshot, for all ranks, as `engine train` checks it; swap/step: bytes read and written\n"
               "   per step; recompute: extra FLOPs per step;";
  std::cout << (world > 1 ? " sent/step: bytes the busiest rank sends per step;\n   " : "\n   ");
  if (search.device)
    std::cout << "device: the GPU's plan per rank (engine plan's device memory); link/step: bytes\n"
                 "   between host and GPU per step of a run staged through the host";
  else
    std::cout << "offload to cpu is left out: on a CPU run the state is already in host memory";
  if (world == 1) std::cout << ";\n   at world size 1 the stages shard nothing, their rows differ only by buffers";
  std::cout << ")\n";
  for (const std::string& note : search.notes) std::cout << "  " << note << "\n";

  const FitRow& as_given = search.rows.front();
  std::cout << "\nthe recipe as given " << (as_given.fits(b) ? "fits" : "does not fit") << ": " << needs(as_given, b)
            << "\n";
  if (!fit.fit) return;
  std::string command = "engine train " + shell_word(args.recipe.string());
  for (const std::string& o : args.overrides) command += " " + shell_word(o);
  if (const FitRow* best = fastest_fit(search.rows, b)) {
    std::cout << "fastest that fits: " << describe(*best, search.layouts) << "; " << needs(*best, b, true)
              << "; predicted " << format_fixed(best->seconds, 3) << " s per step\n";
    for (const std::string& o : best->overrides) command += " " + shell_word(o);
    if (best->proposes_streamed_checkpoints(b)) command += " checkpoint.async=false";
    std::cout << "  " << command << "\n";
    if (best->swap_needed && !search.nvme_path_given)
      std::cout << "  (offload.nvme_path: any directory on a fast local disk with room for the swap files)\n";
    return;
  }
  const FitRow* closest = closest_fit(search.rows, b);
  std::cout << "nothing fits these budgets. The closest is " << describe(*closest, search.layouts) << ", which needs "
            << needs(*closest, b, true) << "\n";
  for (const std::string& o : closest->overrides) command += " " + shell_word(o);
  if (closest->proposes_streamed_checkpoints(b)) command += " checkpoint.async=false";
  std::cout << "  " << command << "\n";
}

}  // namespace engine::cli
