// engine: the command-line entry point. Parses arguments with CLI11 and maps failures to the
// documented exit codes: 2 for user errors, 1 for internal errors (see cli/commands.h).
#include <CLI/CLI.hpp>
#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>

#include <unistd.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "cli/commands.h"
#include "core/cpu_budget.h"
#include "core/device_info.h"
#include "core/error.h"
#include "core/launcher.h"
#include "core/log.h"
#include "core/memory_limit.h"
#include "core/openmp_wait.h"
#include "core/version.h"
#include "recipe/diagnostic.h"

namespace {

// The error went to stderr; where stdout goes elsewhere (a log file, a pipe), its last line would
// otherwise be whatever the command printed before it failed ("recipe.yaml: ok: ..."), so it gets
// the failure's first line too. On one terminal the user already sees the error.
int failed(int code, const std::string& message) {
  if (!(isatty(STDOUT_FILENO) && isatty(STDERR_FILENO))) {
    std::cout.flush();
    std::printf("failed (exit %d): %s\n", code, message.substr(0, message.find('\n')).c_str());
    std::fflush(stdout);
  }
  return code;
}

using engine::cli::RecipeArgs;

void add_recipe_args(CLI::App* command, RecipeArgs& args) {
  command->add_option("recipe", args.recipe, "Recipe file (YAML)")->required();
  command->add_option("overrides", args.overrides, "Overrides: section.key=value or ~section.key");
  command->add_option("--world-size", args.world_size, "Plan for this many ranks (default: from mpirun, else 1)")
      ->check(CLI::Range(1, 1 << 20));
}

std::string version_text() {
  return std::string("engine ") + engine::kVersion + " (" + engine::kGitRevision + ", " + engine::kBuildType + ")\n" +
         engine::accelerator_summary() + "\nrun.device auto trains on: " +
         (engine::cuda_device_count() > 0 ? "cuda:0 (" + engine::cuda_device_name(0) + ")" : std::string("cpu"));
}

// `--resume` takes an optional value: `--resume`, `--resume PATH` and `--resume=PATH` all work, and an
// override or the recipe after a bare --resume stays what it is. Returned as CLI11 wants: reversed.
std::vector<std::string> resume_with_its_value(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "--resume") {
      args.push_back(arg);
      continue;
    }
    const std::string next = i + 1 < argc ? argv[i + 1] : "";
    auto ends_with = [&](const char* suffix) {
      const std::string s = suffix;
      return next.size() >= s.size() && next.compare(next.size() - s.size(), s.size(), s) == 0;
    };
    const bool value = !next.empty() && next[0] != '-' && next.find('=') == std::string::npos && !ends_with(".yaml") &&
                       !ends_with(".yml");
    args.push_back("--resume=" + (value ? next : std::string("latest")));
    if (value) ++i;
  }
  std::reverse(args.begin(), args.end());
  return args;
}

int run(int argc, char** argv, const engine::Launch& launch, const engine::ThreadChoice& threads) {
  CLI::App app{"engine: a declarative training engine driven by YAML recipes"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and build information");
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warning or error (default: ENGINE_LOG_LEVEL, else info on rank 0 and "
                 "warning on the other ranks)");

  RecipeArgs recipe_args;
  auto* validate = app.add_subcommand("validate", "Check a recipe and print a one-line summary, or every error");
  add_recipe_args(validate, recipe_args);

  RecipeArgs train_args;
  auto* train = app.add_subcommand("train", "Train a recipe: progress, metrics.jsonl and weights in the run directory");
  add_recipe_args(train, train_args);
  train->add_option("--dump-first-gradients", train_args.first_gradients,
                    "Write the first step's gradients (before clipping) to this safetensors file, in the "
                    "names and layout of the exported weights; in fp16 they are still multiplied by "
                    "the step's loss scale");
  train
      ->add_option("--dump-gradients-at", train_args.gradients_at,
                   "Write step STEP's gradients (1-based, as in metrics.jsonl; before clipping) to the "
                   "safetensors file PATH, in the names and layout of the exported weights; in fp16 they are "
                   "still multiplied by the step's loss scale; repeatable, once per step")
      ->type_name("STEP PATH");
  train
      ->add_option("--resume", train_args.resume,
                   "Continue from a checkpoint: the latest complete one in checkpoint.dir (no value, or "
                   "`latest`), a checkpoint directory, or a directory of checkpoints (its latest). The word "
                   "after --resume is its value unless it is an override (has '='), an option or a .yaml file")
      ->type_name("[PATH]");
  train
      ->add_option("--stop-after", train_args.stop_after,
                   "Stop after this step with a checkpoint (exit 0), to train in slices; --resume continues")
      ->check(CLI::PositiveNumber);

  RecipeArgs plan_args;
  auto* plan = app.add_subcommand("plan", "Print parameters per wrap unit, FLOPs and the exact memory plan");
  add_recipe_args(plan, plan_args);
  engine::cli::FitArgs fit_args;
  plan->add_option("--host-memory", fit_args.host_memory,
                   "Host memory budget for the ranks on this machine (16GiB, 400MB, bytes; default: the memory "
                   "limit in force: MemAvailable, the cgroup's or ulimit's): prints every ZeRO stage x offload x "
                   "activation checkpointing x micro-batch against the budgets")
      ->type_name("SIZE");
  plan->add_option("--device-memory", fit_args.device_memory,
                   "Device memory budget per GPU for a run on CUDA (run.device cuda, or auto with a GPU here); "
                   "auto: what is free on the GPU now. On a CPU run the device is the host and this is a host budget")
      ->type_name("SIZE|auto");
  plan->add_option("--nvme", fit_args.nvme,
                   "Swap space budget for offload to nvme (default: free space of offload.nvme_path, else of the "
                   "temporary directory the proposal uses)")
      ->type_name("SIZE");
  plan->add_flag("--fit", fit_args.fit,
                 "Propose the fastest configuration that fits the budgets, as overrides for `engine train`");
  plan->add_option("--flops-per-second", fit_args.flops_per_second,
                   "--fit's cost model: the compute rate (default 5e10 on the CPU; on a GPU 4e14, fp32 4e13)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--swap-bandwidth", fit_args.swap_bandwidth,
                   "--fit's cost model: swap bytes read and written per second (default 1GB)")
      ->type_name("SIZE");

  std::filesystem::path export_run, export_destination;
  auto* export_cmd = app.add_subcommand(
      "export", "Write a run's final weights, or a checkpoint's, to a safetensors file (Hugging Face names)");
  export_cmd
      ->add_option("source", export_run,
                   "Run directory (<output_dir>/<name>: its final weights, else its latest checkpoint), a "
                   "checkpoint (a step-N directory) or a directory of checkpoints (the latest)")
      ->required();
  export_cmd->add_option("destination", export_destination, "Output .safetensors file")->required();

  engine::cli::GenerateArgs generate_args;
  auto* generate = app.add_subcommand("generate", "Sample text from a model trained on text data");
  generate->add_option("run_dir", generate_args.run_dir, "Run directory (<output_dir>/<name>)")->required();
  generate->add_option("--prompt", generate_args.prompt, "Text to continue");
  generate->add_option("--tokens", generate_args.tokens, "Tokens to sample")->check(CLI::Range(1, 100000));
  generate->add_option("--temperature", generate_args.temperature, "0 picks the most likely token")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", generate_args.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(0, 1 << 24));
  generate->add_option("--seed", generate_args.seed, "Sampling seed");

  engine::cli::GoldenArgs golden_args;
  auto* golden = app.add_subcommand("golden", "Golden-recipe regression tests: record, check, update");
  golden->require_subcommand(1);
  auto* golden_record = golden->add_subcommand("record", "Run recipes and store their trajectories next to them");
  golden_record->add_option("recipes", golden_args.recipes, "Recipe files")->required();
  golden_record
      ->add_option("--world-size", golden_args.world_size,
                   "Train on this many ranks, each run under mpirun (check and update read it from the golden file)")
      ->check(CLI::Range(1, 1 << 20));
  auto* golden_check = golden->add_subcommand("check", "Rerun recipes and compare; exit 3 on a regression");
  golden_check->add_option("recipes", golden_args.recipes, "Recipe files")->required();
  auto* golden_update = golden->add_subcommand("update", "Rerun recipes and rewrite their golden files");
  golden_update->add_option("recipes", golden_args.recipes, "Recipe files")->required();
  for (auto* writer : {golden_record, golden_update}) {
    writer
        ->add_option("--safety-factor", golden_args.safety_factor,
                     "Band = this factor x the spread measured across forced ISAs and thread counts")
        ->check(CLI::Range(1.0, 1000.0));
    writer->add_flag("!--no-band", golden_args.variants,
                     "Skip the reruns: the golden can then only be checked bitwise where it was recorded");
  }
  auto* golden_trajectory = golden->add_subcommand(
      "trajectory", "Run one recipe in this environment and write its trajectory (a golden file without a band)");
  golden_trajectory->add_option("recipe", golden_args.recipes, "Recipe file")->required()->expected(1);
  golden_trajectory->add_option("--out", golden_args.out, "Where to write the trajectory")->required();
  golden_trajectory->add_flag("--gradient-noise", golden_args.gradient_noise,
                              "Move every fp32 gradient element by up to one ulp each step (a band variant)");

  auto* golden_observe = golden->add_subcommand(
      "observe", "Widen golden bands to cover trajectories run on another machine (engine golden trajectory there)");
  golden_observe->add_option("recipes", golden_args.recipes, "Recipe files")->required();
  golden_observe
      ->add_option("--from", golden_args.from, "Directory holding each recipe's trajectory as <recipe stem>.json")
      ->required();

  bool only_changed = false;
  auto* config = app.add_subcommand("config", "Print the fully resolved recipe, defaults included");
  add_recipe_args(config, recipe_args);
  config->add_flag("--diff", only_changed, "Only the keys whose value differs from the default");

  bool markdown = false;
  auto* schema = app.add_subcommand("schema", "Print the recipe JSON Schema (draft 2020-12)");
  schema->add_flag("--markdown", markdown, "Print the reference page (docs/recipe-reference.md) instead");

  std::filesystem::path plugin_file;
  auto* plugin = app.add_subcommand("plugin", "Lua plugins: what one declares");
  plugin->require_subcommand(1);
  auto* plugin_info = plugin->add_subcommand("info", "Print a plugin's description, parameters and hooks");
  plugin_info->add_option("file", plugin_file, "The plugin's .lua file")->required();

  std::filesystem::path checkpoint_path;
  auto* checkpoint = app.add_subcommand("checkpoint", "Checkpoints: list, inspect and verify them");
  checkpoint->require_subcommand(1);
  auto* checkpoint_list = checkpoint->add_subcommand(
      "list", "One line per complete checkpoint (step, world size, ZeRO stage, size, created); unfinished writes");
  checkpoint_list->add_option("dir", checkpoint_path, "A directory of checkpoints (checkpoint.dir) or a run directory")
      ->required();
  auto* checkpoint_inspect = checkpoint->add_subcommand(
      "inspect", "One checkpoint's manifest: step, world, training state, files and checksums, tensors");
  checkpoint_inspect->add_option("checkpoint", checkpoint_path, "A checkpoint directory (step-N)")->required();
  auto* checkpoint_verify = checkpoint->add_subcommand(
      "verify", "Read every rank file and check its size and checksum; exit 2 naming each damaged file");
  checkpoint_verify
      ->add_option("path", checkpoint_path,
                   "A checkpoint, or a directory of checkpoints or a run directory (verifies every one)")
      ->required();

  std::vector<std::filesystem::path> report_runs;
  std::filesystem::path report_output;
  auto* report = app.add_subcommand(
      "report", "An HTML report of one or more runs (charts, summary table); several runs share the charts");
  report->add_option("run_dirs", report_runs, "Run directories (<output_dir>/<name>), compared on one page")
      ->required();
  report->add_option("--output,-o", report_output, "The HTML file (default: <first run dir>/report.html)");

  std::string topic;
  auto* help = app.add_subcommand("help", "Explain a topic, a section or a key");
  help->add_option("topic", topic, "recipes, overrides, batch, checkpoints, exit-codes, a section or section.key");

  try {
    app.parse(resume_with_its_value(argc, argv));
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? engine::cli::kExitOk : engine::cli::kExitUser;
  }
  engine::log::init_logging(launch.rank, launch.world_size,
                            engine::log::level_for_rank(launch.rank, log_level, std::getenv("ENGINE_LOG_LEVEL")));
  spdlog::debug("{}", threads.note);

  if (show_version) {
    std::cout << version_text() << "\n";
    return engine::cli::kExitOk;
  }
  if (*validate) return engine::cli::validate(recipe_args);
  if (*train) return engine::cli::train(train_args);
  if (*plan) return engine::cli::plan(plan_args, fit_args);
  if (*golden) {
    using Action = engine::cli::GoldenArgs::Action;
    golden_args.action = *golden_record       ? Action::record
                         : *golden_update     ? Action::update
                         : *golden_trajectory ? Action::trajectory
                         : *golden_observe    ? Action::observe
                                              : Action::check;
    return engine::cli::golden(golden_args);
  }
  if (*export_cmd) return engine::cli::export_weights(export_run, export_destination);
  if (*generate) return engine::cli::generate(generate_args);
  if (*config) return engine::cli::config(recipe_args, only_changed);
  if (*schema) return engine::cli::schema(markdown);
  if (*checkpoint_list) return engine::cli::checkpoint_list(checkpoint_path);
  if (*checkpoint_inspect) return engine::cli::checkpoint_inspect(checkpoint_path);
  if (*checkpoint_verify) return engine::cli::checkpoint_verify(checkpoint_path);
  if (*report) return engine::cli::report(report_runs, report_output);
  if (*help) return engine::cli::help(topic);
  if (*plugin_info) return engine::cli::plugin_info(plugin_file);
  std::cout << app.help();
  return engine::cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__x86_64__)
  // Flush denormals to zero (FTZ) and treat denormal inputs as zero (DAZ): tiny optimizer moments
  // and gradients would otherwise run ~100x slower. Set before any thread starts, so the OpenMP
  // and loader threads inherit it.
  _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
  engine::limit_openmp_spinning(argv);  // may re-execute: libgomp reads its settings when loaded
  // Before any OpenMP region: one share of this machine's cores per rank (see docs/threads.md).
  const engine::ThreadChoice threads = engine::apply_cpu_budget();
  const engine::Launch launch = engine::launch_from_environment();
  engine::log::init_logging(launch.rank, launch.world_size, engine::log::Level::info);  // until --log-level is read
  using engine::log::Level, engine::log::verbatim;
  try {
    return run(argc, argv, launch, threads);
  } catch (const engine::recipe::RecipeError& e) {
    size_t count = e.diagnostics().size();
    verbatim(Level::error, std::string(e.what()) + "\n" + std::to_string(count) + (count == 1 ? " error" : " errors"));
    return failed(engine::cli::kExitUser, e.what());
  } catch (const engine::UserError& e) {
    spdlog::error("{}", e.what());
    return failed(engine::cli::kExitUser, e.what());
  } catch (const std::bad_alloc&) {
    // Not a bug: the machine, its cgroup or ulimit gave less memory than the run needed.
    try {
      spdlog::error("{}", engine::out_of_memory_message());
    } catch (...) {  // too little memory even for the message
      std::fputs("error: out of memory (std::bad_alloc)\n", stderr);
    }
    return failed(engine::cli::kExitUser, "out of memory");
  } catch (const std::exception& e) {
    verbatim(Level::error,
             std::string("internal error: ") + e.what() + "\nThis is a bug in the engine; please report it.");
    return failed(engine::cli::kExitInternal, std::string("internal error: ") + e.what());
  }
}
