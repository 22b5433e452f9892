#include "trainer/train.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/version.h"
#include "data/loader.h"
#include "recipe/export.h"
#include "trainer/plugin_driver.h"
#include "trainer/session.h"
#include "trainer/telemetry.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void on_interrupt(int) {
  g_stop_requested = true;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

}  // namespace

namespace {

// Under the names and in the layout of the weights files (GPT-2's Conv1D weights (in, out), Llama's
// q/k/v split), so a gradient lines up with the weight it belongs to in an exported file.
void save_gradients(const fs::path& path, const ParameterStore& store, recipe::Arch arch) {
  write_safetensors(path, hugging_face_tensors(store.graph(), arch, [&](int i) { return store.grad(i); }),
                    {{"layout", "hugging face, as the weights files"}});
}

// The after_backward hook that writes step `step`'s (0-based) gradients to every file the options
// ask for at that step, or none when no file is due.
// Ranks that run different recipes or engines would issue different collectives: refuse at once.
void require_same_run_on_every_rank(dist::Communicator& comm, const std::string& resolved_recipe) {
  const uint64_t mine = std::hash<std::string>{}(resolved_recipe + "\n" + kVersion + " " + kGitRevision);
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof mine, "all-gather of the recipe's and the engine's identity").wait();
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0])
      throw UserError("rank " + std::to_string(r) + " runs a different recipe or engine build than rank 0 (the "
                      "resolved recipe and the engine version must be the same on every rank: same files, same "
                      "overrides, same binary)");
}

std::function<const float*(int)> whole_param(const WholeParameters& whole) {
  return [&whole](int i) { return whole.param(i); };
}

std::function<void()> gradient_dump_hook(int64_t step, const TrainOptions& options, const Session& session,
                                         recipe::Arch arch) {
  if (session.rank != 0) return {};
  std::vector<fs::path> files;
  if (step == 0 && !options.first_gradients.empty()) files.push_back(options.first_gradients);
  if (auto it = options.gradients_at.find(step + 1); it != options.gradients_at.end()) files.push_back(it->second);
  if (files.empty()) return {};
  return [&session, arch, files] {
    for (const fs::path& file : files) save_gradients(file, session.store, arch);
  };
}

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& original, std::ostream& console, const TrainOptions& options) {
  std::unique_ptr<dist::Communicator> local;
  dist::Communicator& comm = options.comm ? *options.comm : *(local = dist::make_local_communicator());
  const bool lead = comm.rank() == 0;
  std::ostream silent(nullptr);  // what the other ranks print to
  std::ostream& out = lead ? console : silent;
  ProgressLine* progress_line = nullptr;  // plugin notes go above the live line once it exists
  PluginDriver plugins(original, [&](const std::string& text) {
    if (progress_line)
      progress_line->note(text);
    else
      out << text << "\n";
  });
  const recipe::LoadedRecipe& loaded = plugins.recipe();  // as on_recipe left it
  const recipe::Recipe& r = loaded.recipe;
  for (const auto& [step, file] : options.gradients_at)
    if (step < 1 || step > r.train.steps)
      throw UserError("--dump-gradients-at " + std::to_string(step) + " " + file.string() +
                      ": the step must be between 1 and train.steps (" + std::to_string(r.train.steps) + ")");
  TrainSummary summary;
  summary.run_dir = fs::path(r.run.output_dir) / r.run.name;
  if (lead) {
    std::error_code error;
    fs::create_directories(summary.run_dir, error);
    if (error) throw UserError(summary.run_dir.string() + ": cannot create the run directory: " + error.message());
    write_text_atomically(summary.run_dir / "recipe.yaml", dump_recipe(loaded, recipe::Schema::engine(), false));
  }

  const int64_t baseline_rss = resident_bytes();  // before the session allocates anything
  if (comm.size() > 1) require_same_run_on_every_rank(comm, dump_recipe(loaded, recipe::Schema::engine(), false));
  CompiledStep compiled = compile_step(r, comm.size());
  check_memory_available(compiled.memory, comm.local_size());
  const TrafficPlan traffic = compiled.traffic;
  Session session(r, std::move(compiled), &comm);
  if ((!options.first_gradients.empty() || !options.gradients_at.empty()) && !session.store.masters_whole())
    throw UserError("gradient dumps need the whole gradient on one rank: distributed.zero_stage " +
                    std::to_string(r.distributed.zero_stage) + " shards it over " + std::to_string(comm.size()) +
                    " ranks; dump at zero_stage 0 (the gradients are the same bits at every stage)");
  session.store.initialize(uint64_t(r.run.seed));
  if (!r.model.init_from.empty()) {
    load_weights(r.model.init_from, session.store, r.model.arch);
    out << "weights loaded from " << r.model.init_from.string() << "\n";
  }
  const int64_t rows_per_step = session.micro_batch * session.accumulation * session.model.sequence * comm.size();
  out << "model: " << session.model.graph.param_count() << " parameters in " << session.model.graph.units().size()
      << " wrap units; data: " << session.data->describe() << "\n";
  if (auto floor = session.data->loss_floor()) out << "loss floor (exact entropy of the data): " << *floor << " nats\n";
  MemoryPlan memory = session.memory();
  if (comm.size() > 1)
    out << "ranks: " << comm.size() << " (" << comm.backend() << "), ZeRO stage " << r.distributed.zero_stage
        << "; each rank sends " << format_bytes(traffic.total()) << " per step\n";
  out << "memory plan" << (comm.size() > 1 ? " per rank: " : ": ") << format_bytes(memory.total())
      << " (activations " << format_bytes(memory.activations) << ")\n";

  std::ofstream metrics;
  if (lead) metrics.open(summary.run_dir / "metrics.jsonl", std::ios::trunc);
  ProgressLine progress(out, lead && isatty(STDOUT_FILENO) && &console == &std::cout, r.train.steps);
  progress_line = &progress;
  plugins.set_metrics(&metrics);
  BatchLoader loader(*session.data, session.micro_batch, session.model.sequence, r.data.prefetch, comm.rank(),
                     comm.size());
  // What every rank must agree on before acting (a Ctrl-C reaches the ranks at different times).
  auto any_rank = [&](bool flag) {
    if (comm.size() == 1) return flag;
    for (double v : session.zero.gather(flag ? 1.0 : 0.0))
      if (v != 0) return true;
    return false;
  };
  int64_t bytes_sent_training = 0;
  g_stop_requested = false;
  auto previous_handler = std::signal(SIGINT, on_interrupt);

  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  int64_t window_rows = 0;
  plugins.train_start();
  for (int64_t step = 0; step < r.train.steps; ++step) {
    plugins.step_start(step);
    Session::StepHooks hooks;
    hooks.before_update = plugins.update_hook(step, session);
    hooks.after_backward = gradient_dump_hook(step, options, session, r.model.arch);
    const int64_t sent_before = comm.bytes_sent();
    const Session::StepResult result = session.train_step(
        step, [&] { return loader.next(); }, hooks);
    bytes_sent_training += comm.bytes_sent() - sent_before;
    const double loss = result.loss, grad_norm = result.grad_norm, lr = result.lr;
    if (result.overflow) {
      ++summary.skipped_steps;
      metrics << nlohmann::json{{"step", step + 1},
                                {"loss", loss},
                                {"overflow", true},
                                {"loss_scale", result.loss_scale},
                                {"next_loss_scale", session.scaler.scale()}}
                     .dump()
              << "\n";
      progress.note("step " + std::to_string(step + 1) + ": fp16 gradients overflowed at loss scale " +
                    format_fixed(result.loss_scale, 0) + "; update skipped" +
                    (result.fell_back ? ", and the minimum scale was reached: continuing in bf16"
                                      : ", next scale " + format_fixed(session.scaler.scale(), 0)));
    } else if (!result.skipped && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
      metrics << nlohmann::json{{"step", step + 1}, {"loss", loss}, {"grad_norm", grad_norm}, {"lr", lr}}.dump()
              << "\n";
      std::signal(SIGINT, previous_handler);
      progress.finish();
      throw UserError("training diverged at step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                      ", gradient norm " + std::to_string(grad_norm) +
                      "; no weights were saved. Lower optimizer.lr, lengthen the warmup or enable "
                      "train.gradient_clipping");
    }
    window_rows += rows_per_step;
    summary.steps = step + 1;
    summary.final_loss = loss;

    plugins.step_end(step, (step + 1) * rows_per_step, result.overflow, result.loss_scale);
    const bool stopping = any_rank(g_stop_requested || plugins.stop_reason());
    const bool last = step + 1 == r.train.steps || stopping;
    if ((step + 1) % r.train.log_every == 0 || last || step == 0) {
      auto now = std::chrono::steady_clock::now();
      double window = std::chrono::duration<double>(now - window_start).count();
      double elapsed = std::chrono::duration<double>(now - start).count();
      double rate = window > 0 ? double(window_rows) / window : 0;
      window_start = now;
      window_rows = 0;
      nlohmann::json line{{"step", step + 1},          {"loss", loss},        {"lr", lr}, {"grad_norm", grad_norm},
                          {"tokens_per_second", rate}, {"elapsed_s", elapsed}};
      if (session.scaler.enabled()) line["loss_scale"] = result.loss_scale;
      metrics << line.dump() << "\n";
      metrics.flush();
      progress.update(step + 1, loss, lr, rate, elapsed, resident_bytes());
    }
    if (r.train.eval_every > 0 && ((step + 1) % r.train.eval_every == 0 || last)) {
      double val = session.evaluate(r.train.eval_batches);
      summary.final_val_loss = val;
      metrics << nlohmann::json{{"step", step + 1}, {"val_loss", val}}.dump() << "\n";
      metrics.flush();
      progress.note("step " + std::to_string(step + 1) + ": validation loss " + format_fixed(val, 4));
      plugins.eval(step, val);
    }
    plugins.end_of_step(step, summary.run_dir, [&](const fs::path& path) {
      const WholeParameters whole(session.store, comm);
      if (lead) save_weights(path, session.model.graph, r.model.arch, {{"steps", std::to_string(step + 1)}}, whole_param(whole));
    }, lead);
    if (stopping) {
      summary.interrupted = true;
      break;
    }
  }
  plugins.train_end(summary.steps, summary.final_loss, summary.final_val_loss, summary.interrupted);
  std::signal(SIGINT, previous_handler);
  progress.finish();
  progress_line = nullptr;

  const int64_t peak_rss = peak_resident_bytes();
  std::vector<int64_t> peak_per_rank;
  for (double v : session.zero.gather(double(peak_rss))) peak_per_rank.push_back(int64_t(v));
  const WholeParameters whole(session.store, comm);
  if (!lead) return summary;
  write_text_atomically(summary.run_dir / "summary.json",
                        nlohmann::json{{"steps", summary.steps},
                                       {"parameters", session.model.graph.param_count()},
                                       {"world_size", comm.size()},
                                       {"zero_stage", r.distributed.zero_stage},
                                       {"bytes_sent_per_step", summary.steps ? bytes_sent_training / summary.steps : 0},
                                       {"planned_bytes_sent_per_step", traffic.total()},
                                       {"peak_rss_bytes_per_rank", peak_per_rank},
                                       {"planned_model_state_bytes", memory.model_states()},
                                       {"final_loss", summary.final_loss},
                                       {"final_val_loss", summary.final_val_loss},
                                       {"loss_floor", session.data->loss_floor() ? *session.data->loss_floor() : -1.0},
                                       {"interrupted", summary.interrupted},
                                       {"skipped_steps", summary.skipped_steps},
                                       {"planned_bytes", memory.total()},
                                       {"baseline_rss_bytes", baseline_rss},
                                       {"peak_rss_bytes", peak_rss}}
                                .dump(2) +
                            "\n");
  fs::path weights = summary.run_dir / "model.safetensors";
  std::string arch = r.model.arch == recipe::Arch::gpt ? "gpt" : r.model.arch == recipe::Arch::llama ? "llama" : "mlp";
  save_weights(weights, session.model.graph, r.model.arch, {{"arch", arch}, {"steps", std::to_string(summary.steps)}},
               whole_param(whole));
  if (summary.interrupted)
    out << "interrupted after step " << summary.steps << "; weights saved to " << weights.string() << "\n";
  else
    out << "done: " << summary.steps << " steps, final loss " << format_fixed(summary.final_loss, 4)
        << "; weights saved to " << weights.string() << "\n";
  return summary;
}

}  // namespace engine
