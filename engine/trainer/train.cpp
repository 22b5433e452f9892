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
std::function<void()> gradient_dump_hook(int64_t step, const TrainOptions& options, const Session& session,
                                         recipe::Arch arch) {
  std::vector<fs::path> files;
  if (step == 0 && !options.first_gradients.empty()) files.push_back(options.first_gradients);
  if (auto it = options.gradients_at.find(step + 1); it != options.gradients_at.end()) files.push_back(it->second);
  if (files.empty()) return {};
  return [&session, arch, files] {
    for (const fs::path& file : files) save_gradients(file, session.store, arch);
  };
}

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& original, std::ostream& out, const TrainOptions& options) {
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
  std::error_code error;
  fs::create_directories(summary.run_dir, error);
  if (error) throw UserError(summary.run_dir.string() + ": cannot create the run directory: " + error.message());
  write_text_atomically(summary.run_dir / "recipe.yaml", dump_recipe(loaded, recipe::Schema::engine(), false));

  const int64_t baseline_rss = resident_bytes();  // before the session allocates anything
  CompiledStep compiled = compile_step(r);
  check_memory_available(compiled.memory);
  Session session(r, std::move(compiled));
  session.store.initialize(uint64_t(r.run.seed));
  if (!r.model.init_from.empty()) {
    load_weights(r.model.init_from, session.store, r.model.arch);
    out << "weights loaded from " << r.model.init_from.string() << "\n";
  }
  const int64_t rows_per_step = session.micro_batch * session.accumulation * session.model.sequence;
  out << "model: " << session.model.graph.param_count() << " parameters in " << session.model.graph.units().size()
      << " wrap units; data: " << session.data->describe() << "\n";
  if (auto floor = session.data->loss_floor()) out << "loss floor (exact entropy of the data): " << *floor << " nats\n";
  MemoryPlan memory = session.memory();
  out << "memory plan: " << format_bytes(memory.total()) << " (activations " << format_bytes(memory.activations)
      << ")\n";

  std::ofstream metrics(summary.run_dir / "metrics.jsonl", std::ios::trunc);
  ProgressLine progress(out, isatty(STDOUT_FILENO) && &out == &std::cout, r.train.steps);
  progress_line = &progress;
  plugins.set_metrics(&metrics);
  BatchLoader loader(*session.data, session.micro_batch, session.model.sequence, r.data.prefetch);
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
    const Session::StepResult result = session.train_step(
        step, [&] { return loader.next(); }, hooks);
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
    const bool last = step + 1 == r.train.steps || g_stop_requested || plugins.stop_reason();
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
      save_weights(path, session.store, r.model.arch, {{"steps", std::to_string(step + 1)}});
    });
    if (g_stop_requested || plugins.stop_reason()) {
      summary.interrupted = true;
      break;
    }
  }
  plugins.train_end(summary.steps, summary.final_loss, summary.final_val_loss, summary.interrupted);
  std::signal(SIGINT, previous_handler);
  progress.finish();
  progress_line = nullptr;

  const int64_t peak_rss = peak_resident_bytes();
  write_text_atomically(summary.run_dir / "summary.json",
                        nlohmann::json{{"steps", summary.steps},
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
  save_weights(weights, session.store, r.model.arch, {{"arch", arch}, {"steps", std::to_string(summary.steps)}});
  if (summary.interrupted)
    out << "interrupted after step " << summary.steps << "; weights saved to " << weights.string() << "\n";
  else
    out << "done: " << summary.steps << " steps, final loss " << format_fixed(summary.final_loss, 4)
        << "; weights saved to " << weights.string() << "\n";
  return summary;
}

}  // namespace engine
