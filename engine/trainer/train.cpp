#include "trainer/train.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_state.h"
#include "checkpoint/weights.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/version.h"
#include "data/loader.h"
#include "recipe/export.h"
#include "telemetry/trace.h"
#include "trainer/metrics_log.h"
#include "trainer/offload_report.h"
#include "trainer/plugin_driver.h"
#include "trainer/progress_line.h"
#include "trainer/run_state.h"
#include "trainer/run_telemetry.h"
#include "trainer/session.h"
#include "trainer/step_decisions.h"
#include "trainer/stop_signals.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

void write_text_atomically(const fs::path& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

// Under the names and in the layout of the weights files (GPT-2's Conv1D weights (in, out), Llama's
// q/k/v split), so a gradient lines up with the weight it belongs to in an exported file.
void save_gradients(const fs::path& path, const ParameterStore& store, recipe::Arch arch) {
  write_safetensors(path, hugging_face_tensors(store.graph(), arch, [&](int i) { return store.grad(i); }),
                    {{"layout", "hugging face, as the weights files"}});
}

// Ranks that run different recipes or engines would issue different collectives: refuse at once.
void require_same_run_on_every_rank(Communicator& comm, const std::string& resolved_recipe) {
  const uint64_t mine = std::hash<std::string>{}(resolved_recipe + "\n" + kVersion + " " + kGitRevision);
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof mine, "all-gather of the recipe's and the engine's identity").wait();
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0])
      throw UserError("rank " + std::to_string(r) +
                      " runs a different recipe or engine build than rank 0 (the "
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

// What the run is about to do: the device, the model and data, the ranks, the memory plan and
// where offloaded state lives.
void report_start(std::ostream& out, const Session& session, const Communicator& comm, const TrafficPlan& traffic) {
  out << "device: " << describe_device(session.device) << "\n";
  if (!session.device_note.empty()) out << session.device_note << "\n";
  out << "model: " << session.model.graph.param_count() << " parameters in " << session.model.graph.units().size()
      << " wrap units; data: " << session.data->describe() << "\n";
  if (auto floor = session.data->loss_floor()) out << "loss floor (exact entropy of the data): " << *floor << " nats\n";
  const MemoryPlan memory = session.memory();
  if (comm.size() > 1)
    out << "ranks: " << comm.size() << " (" << comm.backend() << "), ZeRO stage "
        << session.recipe.distributed.zero_stage << "; each rank sends " << format_bytes(traffic.total())
        << " per step\n";
  out << "memory plan" << (comm.size() > 1 ? " per rank: " : ": ") << format_bytes(memory.total()) << " (activations "
      << format_bytes(memory.activations) << "; + " << format_bytes(memory.checkpoint_snapshot)
      << " while a checkpoint is written)\n";
  if (session.offloaded) describe_offload(out, session, traffic);
}

// A GPU run's device memory against the plan, and where the host's time per step went.
void report_device(std::ostream& out, const Session& session, int64_t trained, double train_seconds) {
  if (session.device.kind != Device::Kind::cuda) return;
  const DeviceMemory memory = session.executor.device_memory();
  out << "device memory peak " << format_bytes(memory.device_peak) << " (the allocator's high-water mark; "
      << "planned " << format_bytes(session.memory().activations + session.memory().scratch) << " of activations "
      << "and casts + the parameters and gradients; cudaMemGetInfo: " << format_bytes(memory.device_used) << " of "
      << format_bytes(memory.device_total) << " in use)\n";
  const DeviceTimes times = session.executor.device_times();
  if (times.runs == 0 || trained <= 0) return;
  out << "host time per step on " << describe_device(session.device) << ": "
      << format_fixed(1e3 * times.enqueue_seconds / double(trained), 1) << " ms enqueuing kernels, "
      << format_fixed(1e3 * times.wait_seconds / double(trained), 1) << " ms waiting for them, "
      << format_fixed(1e3 * session.device_update_seconds / double(trained), 1)
      << " ms in the update (norm, clipping, optimizer), of " << format_fixed(1e3 * train_seconds / double(trained), 1)
      << " ms; inputs copied ahead of " << times.staged_ahead << " of " << times.runs << " runs\n";
}

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& original, std::ostream& console, const TrainOptions& options) {
  std::unique_ptr<Communicator> local;
  Communicator& comm = options.comm ? *options.comm : *(local = make_local_communicator());
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
  recipe::LoadedRecipe loaded = plugins.recipe();  // as on_recipe left it; resuming may change the accumulation
  recipe::Recipe& r = loaded.recipe;
  for (const auto& [step, file] : options.gradients_at)
    if (step < 1 || step > r.train.steps)
      throw UserError("--dump-gradients-at " + std::to_string(step) + " " + file.string() +
                      ": the step must be between 1 and train.steps (" + std::to_string(r.train.steps) + ")");
  const std::string recipe_yaml = dump_recipe(loaded, recipe::Schema::engine(), false);

  // Resuming: the checkpoint, and what changes between its recipe and this one.
  std::optional<fs::path> resume_dir = resume_source(r, options.resume);
  Manifest resume;
  if (resume_dir) {
    resume = read_manifest(*resume_dir);
    std::vector<std::string> notes = check_recipe_change(resume.recipe, recipe_yaml);
    keep_global_batch(r, resume.state, comm.size(), notes);
    if (resume.step >= r.train.steps)
      throw UserError(resume_dir->string() + " is at step " + std::to_string(resume.step) + " and train.steps is " +
                      std::to_string(r.train.steps) + ": nothing is left to train (raise train.steps to continue)");
    out << "resuming from " << resume_dir->string() << " (step " << resume.step << ", written at world size "
        << resume.world_size << ", ZeRO stage " << resume.zero_stage << ")\n";
    for (const std::string& note : notes) out << note << "\n";
  }
  const int64_t first_step = resume_dir ? resume.step : 0;
  if (options.stop_after && (options.stop_after <= first_step || options.stop_after > r.train.steps))
    throw UserError("--stop-after " + std::to_string(options.stop_after) + ": the step must be after the start (" +
                    std::to_string(first_step) + ") and at most train.steps (" + std::to_string(r.train.steps) + ")");

  TrainSummary summary;
  summary.run_dir = fs::path(r.run.output_dir) / r.run.name;
  summary.resumed_from = first_step;
  const fs::path checkpoint_dir = checkpoint_directory(r);
  if (lead) {
    for (const fs::path& dir : {summary.run_dir, checkpoint_dir}) {
      std::error_code error;
      fs::create_directories(dir, error);
      if (error) throw UserError(dir.string() + ": cannot create the directory: " + error.message());
    }
    write_text_atomically(summary.run_dir / "recipe.yaml", recipe_yaml);
  }

  const int64_t baseline_rss = resident_bytes();  // before the session allocates anything
  if (comm.size() > 1)
    require_same_run_on_every_rank(comm, recipe_yaml + "\nresume from step " + std::to_string(first_step));
  if (lead && resume_dir) {
    // Checkpoints past the one resumed from belong to a run that went on from there: they are set
    // aside (renamed, not deleted), so that a later --resume or checkpoint.resume: auto can never
    // pick one of them up in place of this run's own.
    for (const fs::path& newer : committed_checkpoints(checkpoint_dir)) {
      if (checkpoint_step_in_name(newer.filename().string()).value_or(0) <= first_step) continue;
      const fs::path aside = checkpoint_dir / ("abandoned-" + newer.filename().string());
      std::error_code error;
      fs::remove_all(aside, error);
      fs::rename(newer, aside, error);
      if (error) throw UserError(newer.string() + ": cannot set it aside before resuming: " + error.message());
      out << "set aside " << newer.string() << " (past the step resumed from) as " << aside.filename().string() << "\n";
    }
  }
  CompiledStep compiled = compile_step(r, comm.size());
  check_memory_available(compiled.memory, comm.local_size());
  const TrafficPlan traffic = compiled.traffic;
  // Per optimizer step, over all ranks (the same at every world size for the same global batch).
  const double accumulation_steps = double(compiled.sharding.accumulation) * double(comm.size());
  const double model_flops = compiled.model_flops_per_micro_batch * accumulation_steps,
               hardware_flops = compiled.flops_per_micro_batch * accumulation_steps,
               recompute_flops = compiled.recompute.extra_flops * accumulation_steps;
  Session session(r, std::move(compiled), &comm);
  if ((!options.first_gradients.empty() || !options.gradients_at.empty()) && !session.store.masters_whole())
    throw UserError("gradient dumps need the whole gradient on one rank: distributed.zero_stage " +
                    std::to_string(r.distributed.zero_stage) + " shards it over " + std::to_string(comm.size()) +
                    " ranks; dump at zero_stage 0 (the gradients are the same bits at every stage)");
  session.store.initialize(uint64_t(r.run.seed));
  double elapsed_before = 0, restore_seconds = 0;
  if (resume_dir) {
    const auto restore_start = std::chrono::steady_clock::now();
    restore_checkpoint(session, plugins, *resume_dir, resume);
    session.host_changed();
    restore_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - restore_start).count();
    out << "restored " << format_bytes(resume.total_bytes()) << " of checkpoint in " << format_fixed(restore_seconds, 2)
        << " s\n";
    summary.skipped_steps = resume.state.value("skipped_steps", int64_t(0));
    summary.final_loss = resume.state.value("last_loss", 0.0);
    elapsed_before = resume.state.value("elapsed_s", 0.0);
    summary.steps = first_step;
  } else if (!r.model.init_from.empty()) {
    load_weights(r.model.init_from, session.store, r.model.arch);
    out << "weights loaded from " << r.model.init_from.string() << "\n";
  }
  const int64_t rows_per_step = session.micro_batch * session.accumulation * session.model.sequence * comm.size();
  const MemoryPlan memory = session.memory();
  report_start(out, session, comm, traffic);

  MetricsLog metrics;
  if (lead) {
    if (resume_dir) truncate_metrics(summary.run_dir / "metrics.jsonl", first_step);
    metrics.open(summary.run_dir / "metrics.jsonl", resume_dir.has_value());
    if (resume_dir)
      metrics.resumed(first_step, resume_dir->string(), resume.total_bytes(), restore_seconds, resume.world_size);
  }
  ProgressLine progress(out, lead && isatty(STDOUT_FILENO) && &console == &std::cout, r.train.steps);
  progress_line = &progress;
  plugins.set_metrics(metrics.stream());
  RunTelemetry telemetry({.session = session,
                          .lead = lead,
                          .run_dir = summary.run_dir,
                          .recipe_yaml = recipe_yaml,
                          .model_flops_per_step = model_flops,
                          .hardware_flops_per_step = hardware_flops,
                          .recompute_flops_per_step = recompute_flops},
                         out);
  // Rank r reads global micro-batches r, r + W, ...: after a resume, from where the checkpoint stopped.
  const int64_t consumed = resume_dir ? resume.state.at("micro_batches").get<int64_t>() : 0;
  BatchLoader loader(*session.data, session.micro_batch, session.model.sequence, r.data.prefetch,
                     consumed + comm.rank(), comm.size());
  int64_t bytes_sent_training = 0;

  Checkpointer checkpoints(r.checkpoint, checkpoint_dir, comm, session.zero);
  auto last_checkpoint_time = std::chrono::steady_clock::now();
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto settle_checkpoint = [&](bool wait) {
    if (!checkpoints.in_flight()) return;
    trace::Scope event("checkpoint", wait ? "checkpoint wait and commit" : "checkpoint commit");
    if (auto done = checkpoints.settle(wait)) {
      summary.last_checkpoint = done->path;
      progress.note("step " + std::to_string(done->step) + ": checkpoint " + done->path.string() + " (" +
                    format_bytes(done->bytes) + ", written in " + format_fixed(done->write_seconds, 2) + " s)");
      metrics.checkpoint(done->step, done->path.string(), done->bytes, done->write_seconds, done->seconds);
      plugins.checkpoint_written(done->step, done->path);
    }
  };
  auto write_checkpoint = [&](int64_t steps_done) {
    while (checkpoints.in_flight()) settle_checkpoint(true);  // its on_checkpoint runs before this state is taken
    std::optional<trace::Scope> manifest_event(std::in_place, "checkpoint", "checkpoint manifest");
    session.sync_host();  // a GPU run's state, from the device
    const std::vector<StateKind> kinds = state_kinds(session.store, *session.optimizer);
    Manifest m;
    if (lead)
      m = checkpoint_manifest(steps_done, session, plugins, recipe_yaml, summary, elapsed(), kinds);
    else
      m.step = steps_done;
    manifest_event.reset();
    if (session.offload.optimizer == OffloadTier::nvme)  // streamed from the swap file, never staged
      checkpoints.start_streamed(std::move(m),
                                 [&](const Checkpointer::Sink& sink) { stream_rank(session.store, kinds, sink); });
    else
      checkpoints.start(std::move(m),
                        [&](std::vector<std::byte>& image) { snapshot_rank(session.store, kinds, image); });
    last_checkpoint_time = std::chrono::steady_clock::now();
  };
  StopSignals signals(comm.size() > 1);
  auto window_start = start;
  int64_t window_rows = 0;
  SwapWindow swap_window(session.offloaded.get(), first_step);
  plugins.train_start();
  for (int64_t step = first_step; step < r.train.steps; ++step) {
    telemetry.begin_step(step);
    Session::StepHooks hooks;
    {
      trace::Scope event("other", "step start (plugins)");
      plugins.step_start(step);
      hooks.before_update = plugins.update_hook(step, session);
      hooks.after_backward = gradient_dump_hook(step, options, session, r.model.arch);
    }
    const int64_t sent_before = comm.bytes_sent();
    auto next_batch = [&] {
      trace::Scope event("data", "data wait");
      const auto wait_start = std::chrono::steady_clock::now();
      auto batch = loader.next();
      telemetry.add_data_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count());
      return batch;
    };
    const Session::StepResult result = session.train_step(step, next_batch, hooks);
    // The rest of the step in flat phases (a trace's events on one lane never nest).
    std::optional<trace::Scope> phase;
    phase.emplace("other", "step end (metrics, plugins, decisions)");
    bytes_sent_training += comm.bytes_sent() - sent_before;
    const double loss = result.loss, grad_norm = result.grad_norm, lr = result.lr;
    if (result.overflow) {
      ++summary.skipped_steps;
      metrics.overflow(step + 1, loss, result.loss_scale, session.scaler.scale());
      progress.note("step " + std::to_string(step + 1) + ": fp16 gradients overflowed at loss scale " +
                    format_fixed(result.loss_scale, 0) + "; update skipped" +
                    (result.fell_back ? ", and the minimum scale was reached: continuing in bf16"
                                      : ", next scale " + format_fixed(session.scaler.scale(), 0)));
    } else if (!result.skipped && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
      metrics.diverged(step + 1, loss, grad_norm, lr);
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
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_checkpoint_time).count() / 60;
    const StepDecisions decided =
        agree({.stop_signal = StopSignals::received(),
               .plugin_stop = plugins.stop_reason().has_value(),
               .checkpoint_requested = plugins.take_checkpoint_request(),
               .checkpoint_due_by_time = r.checkpoint.every_minutes > 0 && minutes >= r.checkpoint.every_minutes,
               .seconds_since_signal = StopSignals::seconds_since()},
              session.zero, comm.size());
    const bool preempted = decided.stop_signal;
    const bool sliced = options.stop_after == step + 1;
    const bool stopping = preempted || decided.plugin_stop || sliced;
    const bool last = step + 1 == r.train.steps || stopping;
    if ((step + 1) % r.train.log_every == 0 || last || step == first_step) {
      auto now = std::chrono::steady_clock::now();
      double window = std::chrono::duration<double>(now - window_start).count();
      double rate = window > 0 ? double(window_rows) / window : 0;
      const int64_t window_rows_logged = window_rows;
      window_start = now;
      window_rows = 0;
      nlohmann::json line{{"step", step + 1},          {"loss", loss},          {"lr", lr}, {"grad_norm", grad_norm},
                          {"tokens_per_second", rate}, {"elapsed_s", elapsed()}};
      if (session.offloaded) swap_window.log(*session.offloaded, step + 1, line);
      if (session.scaler.enabled()) {
        line["loss_scale"] = result.loss_scale;
        line["skipped_steps"] = summary.skipped_steps;
      }
      const std::string warning = telemetry.add_to_log_line(line, window, window_rows_logged / rows_per_step);
      if (!warning.empty()) progress.note(warning);
      metrics.step_line(line);
      telemetry.log(line, step + 1, result.loss_scale, true);
      progress.update(step + 1, loss, lr, rate, elapsed(), resident_bytes());
    }
    // A run cut by a signal or --stop-after evaluates as the uninterrupted run would (evaluations
    // reach plugins, whose state the checkpoint keeps).
    const bool final_step = step + 1 == r.train.steps || decided.plugin_stop;
    bool checkpoint_requested = decided.checkpoint_requested;
    if (r.train.eval_every > 0 && ((step + 1) % r.train.eval_every == 0 || final_step)) {
      phase.reset();
      double val = session.evaluate(r.train.eval_batches);
      phase.emplace("other", "evaluation results (plugins)");
      summary.final_val_loss = val;
      metrics.validation(step + 1, val);
      telemetry.log({{"val_loss", val}}, step + 1, 1, false);
      progress.note("step " + std::to_string(step + 1) + ": validation loss " + format_fixed(val, 4));
      plugins.eval(step, val);
      // A checkpoint asked for in on_eval is this step's too (every rank evaluates at this step).
      if (agree({.checkpoint_requested = plugins.take_checkpoint_request()}, session.zero, comm.size())
              .checkpoint_requested)
        checkpoint_requested = true;
    }
    phase.reset();
    phase.emplace("other", "end of step (plugins)");
    plugins.end_of_step(step);
    phase.reset();
    settle_checkpoint(false);  // commits a background write that every rank has finished
    const bool due = (r.checkpoint.every_steps > 0 && (step + 1) % r.checkpoint.every_steps == 0) ||
                     checkpoint_requested || decided.checkpoint_due_by_time ||
                     (r.checkpoint.at_end && step + 1 == r.train.steps) || sliced;
    if (preempted) {
      // Within the budget from the signal: this step's checkpoint, if the last write's time says it
      // fits; else the one in flight, if any, is committed and the run resumes from there.
      const double budget = r.checkpoint.preemption_budget, since = decided.seconds_since_signal;
      const std::optional<double> estimate = checkpoints.last_write_seconds();
      if (!estimate || since + *estimate <= budget) {
        write_checkpoint(step + 1);
      } else {
        progress.note("preempted: a checkpoint of step " + std::to_string(step + 1) + " would end past the " +
                      format_fixed(budget, 0) + " s budget (" + format_fixed(since, 1) + " s since the signal + " +
                      format_fixed(*estimate, 1) + " s to write); keeping the last one");
      }
      settle_checkpoint(true);
      summary.preempted = true;
    } else if (due) {
      write_checkpoint(step + 1);
      if (!r.checkpoint.async || last) settle_checkpoint(true);
    }
    telemetry.end_step(step);
    if (stopping) {
      summary.interrupted = !sliced || preempted;
      break;
    }
  }
  while (checkpoints.in_flight()) settle_checkpoint(true);
  telemetry.finish(out);
  plugins.train_end(summary.steps, summary.final_loss, summary.final_val_loss, summary.interrupted);
  progress.finish();
  progress_line = nullptr;

  const int64_t peak_rss = peak_resident_bytes();
  const int64_t trained = summary.steps - first_step;
  const double train_seconds = elapsed() - elapsed_before;
  const DeviceMemory device_memory = session.executor.device_memory();
  report_device(out, session, trained, train_seconds);
  std::vector<int64_t> peak_per_rank;
  for (double v : session.zero.gather(double(peak_rss))) peak_per_rank.push_back(int64_t(v));
  nlohmann::json summary_json{{"steps", summary.steps},
                              {"parameters", session.model.graph.param_count()},
                              {"world_size", comm.size()},
                              {"zero_stage", r.distributed.zero_stage},
                              {"bytes_sent_per_step", trained ? bytes_sent_training / trained : 0},
                              {"planned_bytes_sent_per_step", traffic.total()},
                              {"peak_rss_bytes_per_rank", peak_per_rank},
                              {"planned_model_state_bytes", memory.model_states()},
                              {"final_loss", summary.final_loss},
                              {"final_val_loss", summary.final_val_loss},
                              {"loss_floor", session.data->loss_floor() ? *session.data->loss_floor() : -1.0},
                              {"interrupted", summary.interrupted},
                              {"preempted", summary.preempted},
                              {"resumed_from_step", first_step},
                              {"last_checkpoint", summary.last_checkpoint.string()},
                              {"skipped_steps", summary.skipped_steps},
                              {"planned_bytes", memory.total()},
                              {"planned_checkpoint_snapshot_bytes", memory.checkpoint_snapshot},
                              {"baseline_rss_bytes", baseline_rss},
                              {"peak_rss_bytes", peak_rss},
                              {"device", describe_device(session.device)},
                              {"device_peak_bytes", device_memory.device_peak},
                              {"peak_virtual_bytes", peak_virtual_bytes()},
                              {"model_flops_per_step", model_flops},
                              {"hardware_flops_per_step", hardware_flops},
                              {"recompute_flops_per_step", recompute_flops},
                              {"peak_flops_per_rank", telemetry.peak().flops_per_second},
                              {"peak_flops_source", telemetry.peak().source},
                              {"monitor_samples", telemetry.monitor_samples()},
                              {"monitor_seconds", telemetry.monitor_seconds()}};
  if (summary.preempted) {
    // Within the budget, the checkpoint is what matters; the weights can be exported from it.
    if (lead) {
      write_text_atomically(summary.run_dir / "summary.json", summary_json.dump(2) + "\n");
      out << "preempted after step " << summary.steps << "; "
          << (summary.last_checkpoint.empty() ? std::string("no checkpoint could be written")
                                              : "resume from " + summary.last_checkpoint.string())
          << " (exit status " << kExitRequeue << ": requeue)\n";
    }
    return summary;
  }
  session.sync_host();
  const WholeParameters whole(session.store, comm);
  if (!lead) return summary;
  write_text_atomically(summary.run_dir / "summary.json", summary_json.dump(2) + "\n");
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
