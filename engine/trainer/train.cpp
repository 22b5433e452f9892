#include "trainer/train.h"

#include <unistd.h>

#include <array>
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
#include <set>
#include <vector>

#include "checkpoint/adapters.h"
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
#include "dist/process_groups.h"
#include "recipe/export.h"
#include "telemetry/trace.h"
#include "trainer/metrics_log.h"
#include "trainer/offload_report.h"
#include "trainer/plugin_driver.h"
#include "trainer/progress_line.h"
#include "trainer/run_reports.h"
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

// The trained parameters gathered whole, and the frozen weights (whole on every rank).
std::function<const float*(Graph::WeightRef)> whole_param(const WholeParameters& whole, const ParameterStore& store) {
  auto frozen = store_weights(store);
  return [&whole, frozen](Graph::WeightRef ref) { return ref.frozen ? frozen(ref) : whole.param(ref.index); };
}

// One `engine train` from start to end, in the order it happens: the recipe as the plugins leave
// it and the resumption (prepare), the session with its initial state (build), the logs, loader
// and checkpointer (open_outputs), the steps, and the summary with the weights (finish). Each step
// trains, logs, evaluates and checkpoints as the ranks agreed (StepDecisions).
class TrainingRun {
 public:
  TrainingRun(const recipe::LoadedRecipe& original, std::ostream& console, const TrainOptions& options)
      : options_(options),
        world_(options.comm ? *options.comm : *(local_ = make_local_communicator())),
        lead_(world_.rank() == 0),
        console_(console),
        out_(lead_ ? console : silent_),
        plugins_(original,
                 [this](const std::string& text) {
                   if (progress_)
                     progress_->note(text);
                   else
                     out_ << text << "\n";
                 }),
        loaded_(plugins_.recipe()),  // as on_recipe left it; resuming may change the accumulation
        r_(loaded_.recipe) {}

  TrainSummary run() {
    // The tensor- and data-parallel groups (one group of the whole world without tensor parallelism).
    groups_ = std::make_unique<ProcessGroups>(world_, int(r_.distributed.tensor_parallel),
                                              int(r_.distributed.pipeline_parallel));
    if (!groups_->warning().empty()) console_ << groups_->warning() << "\n";
    prepare();
    build();
    open_outputs();
    plugins_.train_start();
    for (int64_t step = first_step_; step < r_.train.steps; ++step)
      if (!train_step(step)) break;
    return finish();
  }

 private:
  // Options against the recipe, the resumption's checkpoint and what changed since, the run
  // directory with the resolved recipe, and newer checkpoints set aside.
  void prepare() {
    for (const auto& [step, file] : options_.gradients_at)
      if (step < 1 || step > r_.train.steps)
        throw UserError("--dump-gradients-at " + std::to_string(step) + " " + file.string() +
                        ": the step must be between 1 and train.steps (" + std::to_string(r_.train.steps) + ")");
    recipe_yaml_ = dump_recipe(loaded_, recipe::Schema::engine(), false);
    resume_dir_ = resume_source(r_, options_.resume);
    if (resume_dir_) {
      resume_ = read_manifest(*resume_dir_);
      std::vector<std::string> notes = check_recipe_change(resume_.recipe, recipe_yaml_);
      keep_global_batch(r_, resume_.state, comm().size(), notes);
      if (resume_.step >= r_.train.steps)
        throw UserError(resume_dir_->string() + " is at step " + std::to_string(resume_.step) + " and train.steps is " +
                        std::to_string(r_.train.steps) + ": nothing is left to train (raise train.steps to continue)");
      out_ << "resuming from " << resume_dir_->string() << " (step " << resume_.step << ", written at world size "
           << resume_.world_size << ", ZeRO stage " << resume_.zero_stage << ")\n";
      for (const std::string& note : notes) out_ << note << "\n";
    }
    first_step_ = resume_dir_ ? resume_.step : 0;
    if (options_.stop_after && (options_.stop_after <= first_step_ || options_.stop_after > r_.train.steps))
      throw UserError("--stop-after " + std::to_string(options_.stop_after) + ": the step must be after the start (" +
                      std::to_string(first_step_) + ") and at most train.steps (" + std::to_string(r_.train.steps) +
                      ")");
    summary_.run_dir = fs::path(r_.run.output_dir) / r_.run.name;
    summary_.resumed_from = first_step_;
    checkpoint_dir_ = checkpoint_directory(r_);
    if (lead_) {
      for (const fs::path& dir : {summary_.run_dir, checkpoint_dir_}) {
        std::error_code error;
        fs::create_directories(dir, error);
        if (error) throw UserError(dir.string() + ": cannot create the directory: " + error.message());
      }
      write_text_atomically(summary_.run_dir / "recipe.yaml", recipe_yaml_);
    }
    baseline_rss_ = resident_bytes();  // before the session allocates anything
    if (world_.size() > 1)
      require_same_run_on_every_rank(world_, recipe_yaml_ + "\nresume from step " + std::to_string(first_step_));
    if (lead_ && resume_dir_) set_aside_newer_checkpoints();
  }

  // Checkpoints past the one resumed from belong to a run that went on from there: they are set
  // aside (renamed, not deleted), so that a later --resume or checkpoint.resume: auto can never
  // pick one of them up in place of this run's own.
  void set_aside_newer_checkpoints() {
    for (const fs::path& newer : committed_checkpoints(checkpoint_dir_)) {
      if (checkpoint_step_in_name(newer.filename().string()).value_or(0) <= first_step_) continue;
      const fs::path aside = checkpoint_dir_ / ("abandoned-" + newer.filename().string());
      std::error_code error;
      fs::remove_all(aside, error);
      fs::rename(newer, aside, error);
      if (error) throw UserError(newer.string() + ": cannot set it aside before resuming: " + error.message());
      out_ << "set aside " << newer.string() << " (past the step resumed from) as " << aside.filename().string()
           << "\n";
    }
  }

  // The plan, checked against memory; the session, its state initialised, restored or loaded.
  void build() {
    CompiledStep compiled = compile_step(r_, comm().size(), {groups_->tensor_size(), groups_->tensor_rank()},
                                         {groups_->stages(), groups_->stage()});
    check_memory_available(compiled.memory, world_.local_size());
    traffic_ = compiled.traffic;
    // Per optimizer step, over all ranks (the same at every world size for the same global batch): a
    // tensor-parallel rank's graph computes 1/T of each split product.
    const double accumulation_steps =
        double(compiled.sharding.accumulation) * double(comm().size()) * double(groups_->tensor_size());
    if (groups_->stages() > 1) {  // every stage's share of the model, summed (rank 0 holds one)
      std::vector<double> stage_flops{compiled.model_flops_per_micro_batch, compiled.flops_per_micro_batch,
                                      compiled.recompute.extra_flops};
      std::vector<double> all(stage_flops.size() * size_t(groups_->stages()));
      groups_->pipeline()
          ->all_gather(stage_flops.data(), all.data(), int64_t(stage_flops.size() * sizeof(double)),
                       "all-gather of the stages' FLOPs")
          .wait();
      compiled.model_flops_per_micro_batch = compiled.flops_per_micro_batch = compiled.recompute.extra_flops = 0;
      for (int s = 0; s < groups_->stages(); ++s) {
        compiled.model_flops_per_micro_batch += all[size_t(s) * 3];
        compiled.flops_per_micro_batch += all[size_t(s) * 3 + 1];
        compiled.recompute.extra_flops += all[size_t(s) * 3 + 2];
      }
    }
    model_flops_ = compiled.model_flops_per_micro_batch * accumulation_steps;
    hardware_flops_ = compiled.flops_per_micro_batch * accumulation_steps;
    recompute_flops_ = compiled.recompute.extra_flops * accumulation_steps;
    const PipelineLinks links{.stage = groups_->stage(),
                              .stages = groups_->stages(),
                              .schedule = r_.distributed.pipeline_schedule,
                              .group = groups_->pipeline(),
                              .previous = groups_->previous(),
                              .next = groups_->next(),
                              .embedding = groups_->embedding()};
    session_ = std::make_unique<Session>(r_, std::move(compiled), &comm(), &groups_->tensor(), &links);
    Session& session = *session_;
    if ((!options_.first_gradients.empty() || !options_.gradients_at.empty()) && !session.store.masters_whole())
      throw UserError("gradient dumps need the whole gradient on one rank: distributed.zero_stage " +
                      std::to_string(r_.distributed.zero_stage) + " shards it over " + std::to_string(comm().size()) +
                      " ranks; dump at zero_stage 0 (the gradients are the same bits at every stage)");
    session.initialize(uint64_t(r_.run.seed));
    // A LoRA checkpoint holds the adapters and their optimizer state; the frozen base comes from
    // where the run started, as it did then, and is named by its digest before anything else.
    if (r_.lora.rank > 0) {
      load_initial_weights(session.store);
      digest_frozen_base(session);
    }
    if (resume_dir_) {
      const auto restore_start = std::chrono::steady_clock::now();
      restore_checkpoint(session, plugins_, *resume_dir_, resume_);
      session.host_changed();
      restore_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - restore_start).count();
      out_ << "restored " << format_bytes(resume_.total_bytes()) << " of checkpoint in "
           << format_fixed(restore_seconds_, 2) << " s\n";
      summary_.skipped_steps = resume_.state.value("skipped_steps", int64_t(0));
      summary_.final_loss = resume_.state.value("last_loss", 0.0);
      elapsed_before_ = resume_.state.value("elapsed_s", 0.0);
      summary_.steps = first_step_;
    } else if (r_.lora.rank == 0) {
      load_initial_weights(session.store);
    }
    rows_per_step_ = session.micro_batch * session.accumulation * session.model.sequence * comm().size();
    memory_ = session.memory();
    report_start(out_, session, world_, traffic_);
    if (groups_->tensor_size() > 1 || groups_->stages() > 1) out_ << "layout: " << groups_->layout() << "\n";
  }

  // The frozen base's digest over the whole model (a collective of the world): each rank hashes its
  // part, a weight an earlier stage holds too (a tied embedding) left to that stage and a whole
  // (replicated) one to the first rank of the tensor-parallel group, and the ranks of one
  // data-parallel replica (world ranks below T x P) add theirs.
  void digest_frozen_base(Session& session) {
    std::set<std::string> skip;
    if (groups_->tensor().rank() != 0)
      for (const Param& p : session.model.graph.frozen())
        if (!p.slice.split()) skip.insert(p.name);
    if (groups_->stages() > 1) {
      const std::vector<ModelGraph> stages = cut_stages(build_model(r_, 1, 1.0), stage_cuts());
      for (int s = 0; s < groups_->stage(); ++s)
        for (const Param& p : stages[size_t(s)].graph.frozen()) skip.insert(p.name);
    }
    int64_t elements = 0;
    const uint64_t hash = session.store.frozen_hash(skip, &elements);
    const std::array<uint64_t, 2> mine{hash, uint64_t(elements)};
    std::vector<uint64_t> all(2 * size_t(world_.size()));
    world_.all_gather(mine.data(), all.data(), sizeof mine, "all-gather of the frozen base's digest").wait();
    uint64_t sum = 0, count = 0;
    for (size_t r = 0; r < size_t(groups_->tensor_size() * groups_->stages()); ++r) {
      sum += all[2 * r];
      count += all[2 * r + 1];
    }
    session.frozen_base_digest = ParameterStore::hash_text(sum);
    session.frozen_base_elements = int64_t(count);
  }

  // model.init_from (with LoRA: the frozen base) and lora.init_from (a PEFT adapter).
  void load_initial_weights(ParameterStore& store) {
    // A pipeline stage reads its own weights of files that hold the whole model's.
    std::optional<ModelGraph> whole;
    if (groups_->stages() > 1) whole = build_model(r_, 1, 1.0);
    const Graph* whole_graph = whole ? &whole->graph : nullptr;
    if (!r_.model.init_from.empty()) {
      load_weights(r_.model.init_from, store, r_.model.arch, whole_graph);
      out_ << "weights loaded from " << r_.model.init_from.string() << "\n";
    }
    if (r_.lora.rank > 0 && !r_.lora.init_from.empty() && !resume_dir_) {
      load_adapters(r_.lora.init_from, store, r_, whole_graph);
      out_ << "adapters loaded from " << r_.lora.init_from.string() << "\n";
    }
  }

  // metrics.jsonl, the progress line, telemetry, the batch loader and the checkpointer.
  void open_outputs() {
    Session& session = *session_;
    if (lead_) {
      if (resume_dir_) truncate_metrics(summary_.run_dir / "metrics.jsonl", first_step_);
      metrics_.open(summary_.run_dir / "metrics.jsonl", resume_dir_.has_value());
      if (resume_dir_)
        metrics_.resumed(first_step_, resume_dir_->string(), resume_.total_bytes(), restore_seconds_,
                         resume_.world_size);
    }
    progress_ =
        std::make_unique<ProgressLine>(out_, lead_ && isatty(STDOUT_FILENO) && &console_ == &std::cout, r_.train.steps);
    plugins_.set_metrics(metrics_.stream());
    telemetry_ = std::make_unique<RunTelemetry>(TelemetrySetup{.session = session,
                                                               .lead = lead_,
                                                               .run_dir = summary_.run_dir,
                                                               .recipe_yaml = recipe_yaml_,
                                                               .model_flops_per_step = model_flops_,
                                                               .hardware_flops_per_step = hardware_flops_,
                                                               .recompute_flops_per_step = recompute_flops_},
                                                out_);
    // Rank r reads global micro-batches r, r + W, ...: after a resume, from where the checkpoint stopped.
    const int64_t consumed = resume_dir_ ? resume_.state.at("micro_batches").get<int64_t>() : 0;
    loader_ = std::make_unique<BatchLoader>(*session.data, session.micro_batch, session.model.sequence,
                                            r_.data.prefetch, consumed + comm().rank(), comm().size());
    checkpoints_ = std::make_unique<Checkpointer>(r_.checkpoint, checkpoint_dir_, world_);
    signals_ = std::make_unique<StopSignals>(world_.size() > 1);
    swap_window_ = std::make_unique<SwapWindow>(session.offloaded.get(), first_step_);
    start_ = window_start_ = last_checkpoint_time_ = std::chrono::steady_clock::now();
  }

  double elapsed() const {
    return elapsed_before_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // One optimizer step and what follows it; false when the run stops after it.
  bool train_step(int64_t step) {
    Session& session = *session_;
    telemetry_->begin_step(step);
    Session::StepHooks hooks;
    {
      trace::Scope event("other", "step start (plugins)");
      plugins_.step_start(step);
      hooks.before_update = plugins_.update_hook(step, session);
      hooks.after_backward = gradient_dump_hook(step);
    }
    const int64_t sent_before = bytes_sent(), tensor_sent_before = groups_->tensor().bytes_sent();
    auto next_batch = [&] {
      trace::Scope event("data", "data wait");
      const auto wait_start = std::chrono::steady_clock::now();
      auto batch = loader_->next();
      telemetry_->add_data_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count());
      return batch;
    };
    const Session::StepResult result = session.train_step(step, next_batch, hooks);
    // The rest of the step in flat phases (a trace's events on one lane never nest).
    std::optional<trace::Scope> phase;
    phase.emplace("other", "step end (metrics, plugins, decisions)");
    bytes_sent_training_ += bytes_sent() - sent_before;
    tensor_bytes_sent_training_ += groups_->tensor().bytes_sent() - tensor_sent_before;
    check_step(step, result);
    window_rows_ += rows_per_step_;
    summary_.steps = step + 1;
    summary_.final_loss = result.loss;

    plugins_.step_end(step, (step + 1) * rows_per_step_, result.overflow, result.loss_scale);
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_checkpoint_time_).count() / 60;
    const StepDecisions decided =
        agree({.stop_signal = StopSignals::received(),
               .plugin_stop = plugins_.stop_reason().has_value(),
               .checkpoint_requested = plugins_.take_checkpoint_request(),
               .checkpoint_due_by_time = r_.checkpoint.every_minutes > 0 && minutes >= r_.checkpoint.every_minutes,
               .seconds_since_signal = StopSignals::seconds_since()},
              world_);
    const bool preempted = decided.stop_signal;
    const bool sliced = options_.stop_after == step + 1;
    const bool stopping = preempted || decided.plugin_stop || sliced;
    const bool last = step + 1 == r_.train.steps || stopping;
    if ((step + 1) % r_.train.log_every == 0 || last || step == first_step_) log_step(step, result);
    // A run cut by a signal or --stop-after evaluates as the uninterrupted run would (evaluations
    // reach plugins, whose state the checkpoint keeps).
    const bool final_step = step + 1 == r_.train.steps || decided.plugin_stop;
    bool checkpoint_requested = decided.checkpoint_requested;
    if (r_.train.eval_every > 0 && ((step + 1) % r_.train.eval_every == 0 || final_step)) {
      phase.reset();
      if (evaluate(step)) checkpoint_requested = true;
    }
    phase.reset();
    phase.emplace("other", "end of step (plugins)");
    plugins_.end_of_step(step);
    phase.reset();
    settle_checkpoint(false);  // commits a background write that every rank has finished
    const bool due = (r_.checkpoint.every_steps > 0 && (step + 1) % r_.checkpoint.every_steps == 0) ||
                     checkpoint_requested || decided.checkpoint_due_by_time ||
                     (r_.checkpoint.at_end && step + 1 == r_.train.steps) || sliced;
    if (preempted) {
      checkpoint_within_budget(step, decided.seconds_since_signal);
    } else if (due) {
      write_checkpoint(step + 1);
      if (!r_.checkpoint.async || last) settle_checkpoint(true);
    }
    telemetry_->end_step(step);
    if (stopping) summary_.interrupted = !sliced || preempted;
    return !stopping;
  }

  // An fp16 overflow is noted; a loss or norm that is not finite ends the run.
  void check_step(int64_t step, const Session::StepResult& result) {
    const double loss = result.loss, grad_norm = result.grad_norm;
    if (result.overflow) {
      ++summary_.skipped_steps;
      metrics_.overflow(step + 1, loss, result.loss_scale, session_->scaler.scale());
      progress_->note("step " + std::to_string(step + 1) + ": fp16 gradients overflowed at loss scale " +
                      format_fixed(result.loss_scale, 0) + "; update skipped" +
                      (result.fell_back ? ", and the minimum scale was reached: continuing in bf16"
                                        : ", next scale " + format_fixed(session_->scaler.scale(), 0)));
    } else if (!result.skipped && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
      metrics_.diverged(step + 1, loss, grad_norm, result.lr);
      progress_->finish();
      throw UserError("training diverged at step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                      ", gradient norm " + std::to_string(grad_norm) +
                      "; no weights were saved. Lower optimizer.lr, lengthen the warmup or enable "
                      "train.gradient_clipping");
    }
  }

  // The step's metrics line (and telemetry's), and the progress line.
  void log_step(int64_t step, const Session::StepResult& result) {
    const auto now = std::chrono::steady_clock::now();
    const double window = std::chrono::duration<double>(now - window_start_).count();
    const double rate = window > 0 ? double(window_rows_) / window : 0;
    const int64_t window_rows_logged = window_rows_;
    window_start_ = now;
    window_rows_ = 0;
    nlohmann::json line{{"step", step + 1},          {"loss", result.loss},
                        {"lr", result.lr},           {"grad_norm", result.grad_norm},
                        {"tokens_per_second", rate}, {"elapsed_s", elapsed()}};
    if (session_->offloaded) swap_window_->log(*session_->offloaded, step + 1, line);
    if (session_->scaler.enabled()) {
      line["loss_scale"] = result.loss_scale;
      line["skipped_steps"] = summary_.skipped_steps;
    }
    const std::string warning = telemetry_->add_to_log_line(line, window, window_rows_logged / rows_per_step_);
    if (!warning.empty()) progress_->note(warning);
    metrics_.step_line(line);
    telemetry_->log(line, step + 1, result.loss_scale, true);
    progress_->update(step + 1, result.loss, result.lr, rate, elapsed(), resident_bytes());
  }

  // The validation loss, to the logs and plugins; true when on_eval asked for a checkpoint (which
  // every rank agrees on: every rank evaluates at this step).
  bool evaluate(int64_t step) {
    const double val = session_->evaluate(r_.train.eval_batches);
    trace::Scope phase("other", "evaluation results (plugins)");
    summary_.final_val_loss = val;
    metrics_.validation(step + 1, val);
    telemetry_->log({{"val_loss", val}}, step + 1, 1, false);
    progress_->note("step " + std::to_string(step + 1) + ": validation loss " + format_fixed(val, 4));
    plugins_.eval(step, val);
    return agree({.checkpoint_requested = plugins_.take_checkpoint_request()}, world_).checkpoint_requested;
  }

  // Preempted: within the budget from the signal, this step's checkpoint if the last write's time
  // says it fits; else the one in flight, if any, is committed and the run resumes from there.
  void checkpoint_within_budget(int64_t step, double since) {
    const double budget = r_.checkpoint.preemption_budget;
    const std::optional<double> estimate = checkpoints_->last_write_seconds();
    if (!estimate || since + *estimate <= budget) {
      write_checkpoint(step + 1);
    } else {
      progress_->note("preempted: a checkpoint of step " + std::to_string(step + 1) + " would end past the " +
                      format_fixed(budget, 0) + " s budget (" + format_fixed(since, 1) + " s since the signal + " +
                      format_fixed(*estimate, 1) + " s to write); keeping the last one");
    }
    settle_checkpoint(true);
    summary_.preempted = true;
  }

  void settle_checkpoint(bool wait) {
    if (!checkpoints_->in_flight()) return;
    trace::Scope event("checkpoint", wait ? "checkpoint wait and commit" : "checkpoint commit");
    if (auto done = checkpoints_->settle(wait)) {
      summary_.last_checkpoint = done->path;
      progress_->note("step " + std::to_string(done->step) + ": checkpoint " + done->path.string() + " (" +
                      format_bytes(done->bytes) + ", written in " + format_fixed(done->write_seconds, 2) + " s)");
      metrics_.checkpoint(done->step, done->path.string(), done->bytes, done->write_seconds, done->seconds);
      plugins_.checkpoint_written(done->step, done->path);
    }
  }

  void write_checkpoint(int64_t steps_done) {
    Session& session = *session_;
    while (checkpoints_->in_flight()) settle_checkpoint(true);  // its on_checkpoint runs before this state is taken
    std::optional<trace::Scope> manifest_event(std::in_place, "checkpoint", "checkpoint manifest");
    session.sync_host();  // a GPU run's state, from the device
    const std::vector<StateKind> kinds = state_kinds(session.store, *session.optimizer);
    Manifest m;
    if (lead_)
      m = checkpoint_manifest(steps_done, session, plugins_, recipe_yaml_, summary_, elapsed(), kinds);
    else
      m.step = steps_done;
    manifest_event.reset();
    // Streamed from the state while the step waits: from the swap file (never staged), or without
    // checkpoint.async (no snapshot held); else snapshotted and written behind the next steps.
    if (session.offload.optimizer == OffloadTier::nvme || !r_.checkpoint.async)
      checkpoints_->start_streamed(std::move(m),
                                   [&](const Checkpointer::Sink& sink) { stream_rank(session.store, kinds, sink); });
    else
      checkpoints_->start(std::move(m),
                          [&](std::vector<std::byte>& image) { snapshot_rank(session.store, kinds, image); });
    last_checkpoint_time_ = std::chrono::steady_clock::now();
  }

  // The last checkpoint committed, the reports, summary.json and (unless preempted) the weights.
  TrainSummary finish() {
    Session& session = *session_;
    while (checkpoints_->in_flight()) settle_checkpoint(true);
    telemetry_->finish(out_);
    plugins_.train_end(summary_.steps, summary_.final_loss, summary_.final_val_loss, summary_.interrupted);
    progress_->finish();
    progress_.reset();
    const int64_t trained = summary_.steps - first_step_;
    report_device(out_, session, trained, elapsed() - elapsed_before_);
    const nlohmann::json summary_json = summary_record(trained);
    if (summary_.preempted) {
      // Within the budget, the checkpoint is what matters; the weights can be exported from it.
      if (lead_) {
        write_text_atomically(summary_.run_dir / "summary.json", summary_json.dump(2) + "\n");
        out_ << "preempted after step " << summary_.steps << "; "
             << (summary_.last_checkpoint.empty() ? std::string("no checkpoint could be written")
                                                  : "resume from " + summary_.last_checkpoint.string())
             << " (exit status " << kExitRequeue << ": requeue)\n";
      }
      return summary_;
    }
    session.sync_host();
    const WholeParameters whole(session.store, comm());
    // Every weight whole, trained and frozen (a collective of the tensor and pipeline groups).
    const WholeValues weights_whole = gather_whole(whole_param(whole, session.store), true);
    if (!lead_) return summary_;
    write_text_atomically(summary_.run_dir / "summary.json", summary_json.dump(2) + "\n");
    fs::path weights = summary_.run_dir / "model.safetensors";
    std::string arch = r_.model.arch == recipe::Arch::gpt     ? "gpt"
                       : r_.model.arch == recipe::Arch::llama ? "llama"
                                                              : "mlp";
    std::map<std::string, std::string> metadata{{"arch", arch}, {"steps", std::to_string(summary_.steps)}};
    if (r_.lora.rank > 0) metadata.merge(lora_metadata(r_));
    save_weights(weights, weights_whole.graph(), r_.model.arch, metadata,
                 [&](Graph::WeightRef ref) { return weights_whole.value(ref); });
    if (summary_.interrupted)
      out_ << "interrupted after step " << summary_.steps << "; weights saved to " << weights.string() << "\n";
    else
      out_ << "done: " << summary_.steps << " steps, final loss " << format_fixed(summary_.final_loss, 4)
           << "; weights saved to " << weights.string() << "\n";
    return summary_;
  }

  using WeightValues = std::function<const float*(Graph::WeightRef)>;

  // Where the run's pipeline is cut (the units each stage trains), for cutting other builds of it.
  std::vector<int> stage_cuts() const { return pipeline_boundaries(r_, groups_->stages(), groups_->tensor_size()); }

  // This rank's tensor-parallel slices of `value` (a weight's values, or a gradient: null for none, as a
  // frozen weight has), each assembled whole, by name: a collective of the tensor-parallel group.
  std::map<std::string, std::vector<float>> gather_slices(const WeightValues& value) {
    std::map<std::string, std::vector<float>> logical;
    if (groups_->tensor_size() == 1) return logical;
    const Graph& graph = session_->model.graph;
    for (const Graph::WeightRef ref : graph.weights()) {
      const Param& p = graph.weight(ref);
      if (!p.slice.split()) continue;
      if (const float* values = value(ref))
        logical[p.name] = gather_logical(p, values, graph.value(p.value).shape.numel(), groups_->tensor());
    }
    return logical;
  }

  // Every stage's `value` of its weights by name (frozen ones only `with_frozen`), on every rank of
  // each pipeline group: stage s broadcasts them in its graph's order, which every rank knows from
  // the whole model's cut. `logical`: this rank's split ones, whole (gather_slices).
  std::map<std::string, std::vector<float>> gather_stages(const ModelGraph& model, const WeightValues& value,
                                                          const std::map<std::string, std::vector<float>>& logical,
                                                          bool with_frozen) {
    const std::vector<ModelGraph> stages = cut_stages(model, stage_cuts());
    const Graph& mine = session_->model.graph;
    std::map<std::string, std::vector<float>> by_name;
    for (int s = 0; s < groups_->stages(); ++s) {
      const Graph& stage = stages[size_t(s)].graph;
      int64_t total = 0;
      for (const Graph::WeightRef ref : stage.weights())
        if (with_frozen || !ref.frozen) total += stage.value(stage.weight(ref).value).shape.numel();
      std::vector<float> values(static_cast<size_t>(total));
      if (s == groups_->stage()) {
        float* at = values.data();
        for (const Graph::WeightRef ref : mine.weights()) {
          if (!with_frozen && ref.frozen) continue;
          const Param& p = mine.weight(ref);
          at = logical.count(p.name) ? std::copy(logical.at(p.name).begin(), logical.at(p.name).end(), at)
                                     : std::copy_n(value(ref), mine.value(p.value).shape.numel(), at);
        }
      }
      groups_->pipeline()->broadcast(values.data(), total * 4, s, "broadcast of a pipeline stage's weights").wait();
      const float* at = values.data();
      for (const Graph::WeightRef ref : stage.weights()) {
        if (!with_frozen && ref.frozen) continue;
        const Param& p = stage.weight(ref);
        const int64_t n = stage.value(p.value).shape.numel();
        by_name.try_emplace(p.name, at, at + n);
        at += n;
      }
    }
    return by_name;
  }

  // `value` of every weight of the whole model, as rank 0 reads it: named by the whole model's graph
  // (built for it when the ranks hold pipeline stages), a split weight assembled from its slices.
  struct WholeValues {
    const Graph* local;                                      // this rank's graph
    WeightValues value_here;                                 // its values
    std::map<std::string, std::vector<float>> logical = {};  // its split weights, whole
    std::optional<ModelGraph> model = {};                    // with stages: the whole model ...
    std::map<std::string, std::vector<float>> staged = {};   // ... and every stage's values by name
    bool with_frozen = true;

    const Graph& graph() const { return model ? model->graph : *local; }
    const float* value(Graph::WeightRef ref) const {
      if (ref.frozen && !with_frozen) return nullptr;
      const std::string& name = graph().weight(ref).name;
      if (model) return staged.at(name).data();
      auto whole = logical.find(name);
      return whole != logical.end() ? whole->second.data() : value_here(ref);
    }
  };
  // A collective of the tensor-parallel and pipeline groups (none without them); `with_frozen`:
  // the frozen weights' values too (else null, as for gradients).
  WholeValues gather_whole(const WeightValues& value, bool with_frozen) {
    WholeValues whole{.local = &session_->model.graph, .value_here = value, .with_frozen = with_frozen};
    whole.logical = gather_slices(value);
    if (groups_->stages() > 1) {
      whole.model = build_model(r_, 1, 1.0);
      whole.staged = gather_stages(*whole.model, value, whole.logical, with_frozen);
    }
    return whole;
  }

  // --dump-gradients-at and the first step's dump: the whole model's gradients, written by rank 0
  // once the step's gradients are reduced. Split over tensor-parallel ranks or pipeline stages, every
  // rank takes part: the slices are assembled and the stages' gradients broadcast to rank 0's group.
  // Under the names and in the layout of the weights files (GPT-2's Conv1D weights (in, out), Llama's
  // q/k/v split), so a gradient lines up with the weight it belongs to in an exported file.
  std::function<void()> gradient_dump_hook(int64_t step) {
    std::vector<fs::path> files;
    if (step == 0 && !options_.first_gradients.empty()) files.push_back(options_.first_gradients);
    if (auto it = options_.gradients_at.find(step + 1); it != options_.gradients_at.end()) files.push_back(it->second);
    const bool split = groups_->tensor_size() > 1 || groups_->stages() > 1;
    if (files.empty()) return {};
    // Rank 0 alone writes them, but every rank takes a hook, so every rank's step reads its losses
    // and decides its update at the same point, its collectives in the same order.
    if (!lead_ && !split) return [] {};
    return [this, files] {
      const ParameterStore& store = session_->store;
      const WholeValues gradients =
          gather_whole([&](Graph::WeightRef ref) { return ref.frozen ? nullptr : store.grad(ref.index); }, false);
      if (!lead_) return;
      const auto tensors = hugging_face_tensors(gradients.graph(), r_.model.arch,
                                                [&](Graph::WeightRef ref) { return gradients.value(ref); });
      for (const fs::path& file : files)
        write_safetensors(file, tensors, {{"layout", "hugging face, as the weights files"}});
    };
  }

  // summary.json: the run's outcome, its plan against what it measured (a collective: every
  // rank's peak resident memory).
  nlohmann::json summary_record(int64_t trained) {
    Session& session = *session_;
    const int64_t peak_rss = peak_resident_bytes();
    const DeviceMemory device_memory = session.executor.device_memory();
    std::vector<int64_t> peak_per_rank;
    for (double v : gather_values(world_, {double(peak_rss)}, "each rank's peak resident memory"))
      peak_per_rank.push_back(int64_t(v));
    nlohmann::json record{{"steps", summary_.steps},
                          {"parameters", session.model.graph.param_count()},
                          {"world_size", world_.size()},
                          {"tensor_parallel", groups_->tensor_size()},
                          {"zero_stage", r_.distributed.zero_stage},
                          {"bytes_sent_per_step", trained ? bytes_sent_training_ / trained : 0},
                          {"planned_bytes_sent_per_step", traffic_.total()},
                          {"tensor_bytes_sent_per_step", trained ? tensor_bytes_sent_training_ / trained : 0},
                          {"planned_tensor_bytes_sent_per_step", traffic_.tensor},
                          {"peak_rss_bytes_per_rank", peak_per_rank},
                          {"planned_model_state_bytes", memory_.model_states()},
                          {"final_loss", summary_.final_loss},
                          {"final_val_loss", summary_.final_val_loss},
                          {"loss_floor", session.data->loss_floor() ? *session.data->loss_floor() : -1.0},
                          {"interrupted", summary_.interrupted},
                          {"preempted", summary_.preempted},
                          {"resumed_from_step", first_step_},
                          {"last_checkpoint", summary_.last_checkpoint.string()},
                          {"skipped_steps", summary_.skipped_steps},
                          {"planned_bytes", memory_.total()},
                          {"planned_checkpoint_snapshot_bytes", memory_.checkpoint_snapshot},
                          {"baseline_rss_bytes", baseline_rss_},
                          {"peak_rss_bytes", peak_rss},
                          {"device", describe_device(session.device)},
                          {"device_peak_bytes", device_memory.device_peak},
                          {"peak_virtual_bytes", peak_virtual_bytes()},
                          {"model_flops_per_step", model_flops_},
                          {"hardware_flops_per_step", hardware_flops_},
                          {"recompute_flops_per_step", recompute_flops_},
                          {"peak_flops_per_rank", telemetry_->peak().flops_per_second},
                          {"peak_flops_source", telemetry_->peak().source},
                          {"monitor_samples", telemetry_->monitor_samples()},
                          {"monitor_seconds", telemetry_->monitor_seconds()}};
    if (groups_->stages() > 1) add_pipeline_bubble(record);
    return record;
  }

  // Each stage's idle fraction over the run's steps (the time it waited for its neighbours), next to
  // the schedule's bubble (stages - 1) / (micro-batches + stages - 1); printed and in summary.json.
  void add_pipeline_bubble(nlohmann::json& record) {
    const Session& s = *session_;
    const double mine = s.pipeline_seconds > 0 ? s.pipeline_wait_seconds / s.pipeline_seconds : 0.0;
    const std::vector<double> idle = gather_values(*groups_->pipeline(), {mine}, "each pipeline stage's idle fraction");
    const double p = groups_->stages(), m = double(s.accumulation);
    const double bubble = (p - 1) / (m + p - 1);
    record["pipeline_stages"] = groups_->stages();
    record["pipeline_idle_fraction_per_stage"] = idle;
    record["pipeline_bubble"] = bubble;
    out_ << "pipeline: " << groups_->stages() << " stages, " << s.accumulation << " micro-batches per step ("
         << (r_.distributed.pipeline_schedule == recipe::PipelineSchedule::gpipe ? "GPipe" : "1F1B")
         << "); idle (waiting for the other stages):";
    for (size_t k = 0; k < idle.size(); ++k) out_ << " stage " << k << " " << format_fixed(100 * idle[k], 1) << "%";
    out_ << "; the schedule's bubble (P - 1) / (M + P - 1) = " << format_fixed(100 * bubble, 1) << "%\n";
  }

  const TrainOptions& options_;
  std::unique_ptr<Communicator> local_;
  Communicator& world_;
  std::unique_ptr<ProcessGroups> groups_;
  // The data-parallel group: the whole world without tensor parallelism.
  Communicator& comm() { return groups_->data(); }
  // What this rank has sent in both groups.
  int64_t bytes_sent() {
    int64_t sent = comm().bytes_sent() + (groups_->tensor_size() > 1 ? groups_->tensor().bytes_sent() : 0);
    for (Communicator* group : {groups_->pipeline(), groups_->previous(), groups_->next(), groups_->embedding()})
      if (group) sent += group->bytes_sent();
    // A GPU run's device collectives: NCCL's own traffic (the staged communicator's goes through
    // comm() and is counted there).
    if (session_ && session_->device_collectives && session_->device_collectives->backend() == "nccl")
      sent += session_->device_collectives->bytes_sent();
    return sent;
  }
  const bool lead_;
  std::ostream silent_{nullptr};  // what the other ranks print to
  std::ostream& console_;
  std::ostream& out_;
  std::unique_ptr<ProgressLine> progress_;  // plugin notes go above the live line once it exists
  PluginDriver plugins_;
  recipe::LoadedRecipe loaded_;
  recipe::Recipe& r_;
  std::string recipe_yaml_;
  std::optional<fs::path> resume_dir_;
  Manifest resume_;
  int64_t first_step_ = 0;
  TrainSummary summary_;
  fs::path checkpoint_dir_;
  int64_t baseline_rss_ = 0;
  TrafficPlan traffic_;
  double model_flops_ = 0, hardware_flops_ = 0, recompute_flops_ = 0;
  std::unique_ptr<Session> session_;
  double elapsed_before_ = 0, restore_seconds_ = 0;
  int64_t rows_per_step_ = 0;
  MemoryPlan memory_;
  MetricsLog metrics_;
  std::unique_ptr<RunTelemetry> telemetry_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<Checkpointer> checkpoints_;
  std::unique_ptr<StopSignals> signals_;
  std::unique_ptr<SwapWindow> swap_window_;
  std::chrono::steady_clock::time_point start_, window_start_, last_checkpoint_time_;
  int64_t window_rows_ = 0, bytes_sent_training_ = 0, tensor_bytes_sent_training_ = 0;
};

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& original, std::ostream& console, const TrainOptions& options) {
  return TrainingRun(original, console, options).run();
}

}  // namespace engine
