// Session: everything a recipe compiles into, ready to step. Building one validates the data,
// builds the model graph, differentiates it, plans memory for training and evaluation, and
// allocates parameters, gradients, optimizer state and the activation arena, once.
//
//   Session session(loaded.recipe, compile_step(loaded.recipe, comm->size()), comm.get());
//   session.initialize(seed);
//   StepResult r = session.train_step(step, [&] { return loader.next(); });
//   MemoryPlan memory = session.memory();
//
// The step is where precision meets the optimizer: micro-batches accumulate gradients (scaled by
// the fp16 loss scale), an overflowing step is skipped, gradients are unscaled and clipped, and
// only then does the update run and the 16-bit parameter copies refresh.
//
// Across ranks (distributed section): rank r runs micro-batches r, r + world, r + 2 world, ... of
// each global batch; every collective goes through ZeroStep (dist/zero_step.h). Each micro-batch's
// gradient is computed alone and added to the step's sum in global micro-batch order, at every
// world size and stage, so world 2 at any stage gives the bits of world 1 accumulating 2.
#pragma once

#include <functional>
#include <memory>

#include "data/dataset.h"
#include "dist/communicator.h"
#include "dist/tensor_group.h"
#include "dist/zero_step.h"
#include "graph/recompute.h"
#include "linalg/linear_gelu.h"
#include "models/model.h"
#include "models/pipeline_stage.h"
#include "nn/add_norm.h"
#include "nn/attention.h"
#include "nn/layernorm.h"
#include "offload/offloaded_state.h"
#include "optim/device_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "recipe/load.h"
#include "runtime/executor.h"
#include "runtime/parameters.h"
#include "telemetry/trace.h"
#include "trainer/device.h"

namespace engine {

// One rank's memory, from the plan.
struct MemoryPlan {
  int64_t parameters = 0;  // fp32 masters and the compute-dtype values this rank holds
  int64_t frozen = 0;      // of `parameters`: the frozen weights (LoRA's base), whole on every rank
  int64_t gradients = 0;   // micro-batch gradients, the reduced shard, its fp32 form
  int64_t optimizer_state = 0, inputs = 0;
  int64_t activations = 0;   // the arena's peak, gathered and gradient buffers included
  int64_t zero_buffers = 0;  // what stage 3's gathered and stage 2-3's gradient buffers add to it
  int64_t scratch = 0;       // f32 copies for kernels that compute 16-bit values in fp32
  int64_t host = 0;          // activations held in host memory (cpu_checkpointing)
  int64_t staging = 0;       // the communicator's buffer for the peers' chunks of a reduce-scatter
  // This rank's checkpoint file, snapshotted while a checkpoint is written (not in total(): it
  // exists only then; check_memory_available counts it). With checkpoint.async false (or the
  // optimizer state on nvme) the state is streamed instead, through streamed_checkpoint: one
  // piece of the offloaded state at a time, or nothing.
  int64_t checkpoint_snapshot = 0;
  int64_t streamed_checkpoint = 0;
  // Offload (offload section): the chunks of the streamed optimizer step, the shard reads ahead of
  // the gathers and the bounce buffer, in memory; the swap files, on disk (not in total()). State
  // offloaded to cpu stays in host memory and is counted where it would be without offload.
  int64_t offload_buffers = 0;
  int64_t swap = 0;
  // A GPU run (run.device cuda): the arena and the f32 scratch above are the device's
  // (plan_device_memory), not the host's, and not in total(); the host holds page-locked staging
  // instead (`pinned`): the inputs' two slots, the host activations' page-locked copies, and a run
  // staged through the host its mirrors of ZeRO's buffers (staged_mirror_bytes).
  int64_t on_device = 0, pinned = 0;
  int64_t total() const {  // host memory
    return parameters + gradients + optimizer_state + activations + inputs + scratch + host + staging +
           offload_buffers - on_device + pinned;
  }
  int64_t model_states() const { return parameters + gradients + optimizer_state; }
  // The activations the host holds: none of the arena's on a GPU run.
  int64_t host_activations() const { return on_device > 0 ? 0 : activations; }
};

// Bytes each rank sends per optimizer step, from the plan's collectives.
struct TrafficPlan {
  int64_t gradients = 0, parameters = 0;  // reduce-scatters (+ stage 0's gather); gathers
  int64_t tensor = 0;                     // the tensor-parallel group's all-reduces and gathers
  int64_t pipeline = 0;                   // activations and their gradients to the neighbouring stages
  int64_t total() const { return gradients + parameters + tensor + pipeline; }
  // Bytes each rank reads from and writes to its swap files per optimizer step (offload to nvme).
  int64_t swap_read = 0, swap_written = 0;
};

// What a recipe compiles into before anything is allocated: the differentiated model graph and the
// plans of a training and an evaluation step. `engine plan` stops here.
// What the GPU plan's fusion passes changed (run.fusions): products that carry their GELU
// (ops/linalg/linear_gelu.h), gradient copies a norm's backward reads instead (nn/layernorm.h),
// residual adds that the norm after them carries (nn/add_norm.h), bias gradients summed by the norm
// backward that writes their output gradient (nn/layernorm.h).
struct FusionReport {
  ops::GeluFusions gelu;
  int gradient_copies = 0;
  int residual_norms = 0;
  int bias_gradients = 0;
  int unordered_attention = 0;  // attention backwards allowed cuDNN's unordered sums (run.deterministic: false)
  int total() const { return gelu.forward + gelu.backward + gradient_copies + residual_norms + bias_gradients; }
};

struct CompiledStep {
  ModelGraph model;
  Plan train, eval;
  MemoryPlan memory;
  double flops_per_micro_batch = 0;  // forward + backward (+ recompute), counted from the graph's nodes
  // Model FLOPs (the numerator of MFU, as PaLM and Megatron count them): 3x the forward matmuls
  // (linear layers and the causal half of attention's two products), whatever the step recomputes
  // or how its kernels are built. flops_per_micro_batch is what the hardware executes.
  double model_flops_per_micro_batch = 0;
  RecomputeReport recompute;
  FusionReport fusions;   // GPU plans (run.fusions)
  ShardingSpec sharding;  // rank 0's; the plan is the same on every rank
  TrafficPlan traffic;
  OffloadSpec offload;  // rank 0's (the swap file names differ per rank)
  TensorLayout tensor;  // the tensor-parallel group the graph is split for
  PipelineLayout pipeline;
  // A pipeline stage's forward pass on its own, in training mode (dropout as the backward's recompute
  // draws it): what the schedule runs before a micro-batch's backward (empty with one stage).
  Plan forward;
};
// world: the data-parallel ranks; tensor: the tensor-parallel group and this rank's place in it,
// whose slices of the split layers the graph holds (by default the whole model).
// pipeline: the stage of the model this rank computes (models/pipeline_stage.h; by default all).
CompiledStep compile_step(const recipe::Recipe& recipe, int world = 1, TensorLayout tensor = {},
                          PipelineLayout pipeline = {});

// The ops whose FLOPs model FLOPs count: matrix products.
bool is_matmul(const OpDef& op);
// Whether `node` reads a frozen weight (LoRA's base): its matrix product has no weight gradient.
bool reads_frozen_weight(const Graph& g, const Node& node);

// The type the step computes in: f32, or the 16-bit type of precision.mode.
DType compute_dtype(const recipe::Recipe& recipe);

// The page-locked mirrors a GPU run staged through the host holds for ZeRO's buffers: `plans`'
// actions replayed twice (the pool outlives a run) through the runner's MirrorPool
// (runtime/mirror_pool.h), the pool's bytes.
int64_t staged_mirror_bytes(const Graph& g, const std::vector<const Plan*>& plans);

// Throws UserError when `local_ranks` ranks of this plan need more memory than the machine has available.
void check_memory_available(const MemoryPlan& memory, int local_ranks = 1);

// Pipeline parallelism: a rank's stage and the groups it talks through (one stage: none).
struct PipelineLinks {
  int stage = 0, stages = 1;
  recipe::PipelineSchedule schedule = recipe::PipelineSchedule::one_f_one_b;
  Communicator* group = nullptr;      // one rank per stage
  Communicator* previous = nullptr;   // this stage and the one before (rank 0 the earlier)
  Communicator* next = nullptr;       // this stage and the one after
  Communicator* embedding = nullptr;  // the first and last stage (a tied embedding)
};

class Session {
 public:
  // One process (a local communicator), or rank comm->rank() of comm->size() with `compiled` made
  // for that world size.
  explicit Session(const recipe::Recipe& recipe);
  // With distributed.tensor_parallel > 1, `comm` is the data-parallel group and `tensor_comm` the
  // tensor-parallel one (dist/process_groups.h).
  Session(const recipe::Recipe& recipe, CompiledStep compiled, Communicator* comm = nullptr,
          Communicator* tensor_comm = nullptr, const PipelineLinks* pipeline_links = nullptr);

  // The model's initial weights from `seed` (ParameterStore::initialize), on every rank: each rank
  // of several draws its shard of each trained weight and the shards are gathered, the bits of
  // one process drawing them all. A collective.
  void initialize(uint64_t seed);

  // Forward and backward of one micro-batch (gradients accumulate); returns its mean loss.
  double train_micro_batch(const Batch& batch, int64_t step, int64_t micro, double loss_scale = 1.0);

  struct StepResult {
    double loss = 0;         // mean over the step's micro-batches
    double grad_norm = 0;    // global L2 norm of the unscaled gradients, before clipping
    double lr = 0;           // of this update (the schedule counts applied updates)
    double loss_scale = 1;   // the scale this step's backward ran with
    bool overflow = false;   // the gradients held inf or NaN (fp16): the update was skipped
    bool skipped = false;    // no update was applied (overflow, or vetoed by before_update)
    bool fell_back = false;  // this step's overflow at the minimum scale switched fp16 to bf16
  };
  struct StepHooks {
    // Sees the accumulated gradients as the backward left them (loss-scaled), before any check.
    std::function<void()> after_backward;
    // Sees the step's result before the update, with the gradients unscaled and clipped; may change
    // result.lr, and returns false to skip the update (a loss-spike guard).
    std::function<bool(StepResult&)> before_update;
  };
  // One optimizer step: zero the gradients, run every micro-batch from `next_batch`, check for
  // overflow, unscale and clip, update. `engine train`, `engine golden` and the tests all step
  // through here.
  //
  // Where the data ignores some targets (a loss mask), the step's micro-batches are read first and
  // the loss is the mean over the step's trained tokens, every rank's: each micro-batch runs with its
  // loss scale times positions / trained tokens (the graph's loss divides by the positions), and the
  // loss reported is the trained tokens' mean.
  //
  // A GPU run whose hooks need nothing before the update reads nothing back until the step's end:
  // the micro-batches' losses stay on the device, the update is decided there, and the host waits
  // once, for the losses and the decision, while the update runs (finish_step_on_device).
  template <class NextBatch>
  StepResult train_step(int64_t step, NextBatch&& next_batch, const StepHooks& hooks = {}) {
    const double scale = scaler.scale();
    reads_deferred_ = device_optimizer && !hooks.after_backward && !hooks.before_update;
    struct Reset {  // train_micro_batch outside a step (or after one that threw) reads its loss at once
      bool& flag;
      ~Reset() { flag = false; }
    } reset{reads_deferred_};
    double loss_factor = 1.0;  // what each micro-batch's loss is multiplied by
    std::vector<double> losses;
    if (pipeline.stages > 1) {  // every micro-batch read first, then through the stages
      std::vector<Batch> batches;
      int64_t trained = 0;
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        batches.push_back(next_batch());
        if (data->ignores_targets()) trained += trained_targets(batches.back());
      }
      const double normalization = data->ignores_targets() ? trained_normalization(trained) : 1.0;
      losses = pipeline_micro_batches(step, batches, scale * normalization);
      for (double& loss : losses) loss *= normalization;
    } else if (data->ignores_targets()) {
      std::vector<Batch> batches;
      int64_t trained = 0;
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        batches.push_back(next_batch());
        trained += trained_targets(batches.back());
      }
      loss_factor = trained_normalization(trained);
      for (int64_t micro = 0; micro < accumulation; ++micro)
        losses.push_back(train_micro_batch(batches[size_t(micro)], step, micro, scale * loss_factor) * loss_factor);
    } else {
      for (int64_t micro = 0; micro < accumulation; ++micro)
        losses.push_back(train_micro_batch(next_batch(), step, micro, scale));
    }
    if (reads_deferred_) return finish_step_on_device(losses, loss_factor, scale);
    double loss;
    {
      trace::Scope event("communication", "mean loss");
      loss = last_stage_value(zero.mean_loss(losses));
    }
    return finish_step(loss, scale, hooks);
  }
  PipelineLinks pipeline;  // this rank's stage (one stage: no pipeline)
  // The micro-batches of one step through this stage on the schedule: forward passes handing
  // activations on, backward passes (each recomputing its forward) handing gradients back. Returns
  // each micro-batch's mean loss on the last stage (zeros elsewhere). pipeline_schedule.cpp.
  std::vector<double> pipeline_micro_batches(int64_t step, const std::vector<Batch>& batches, double loss_scale);
  // The last stage's `value` on every stage (itself without a pipeline).
  double last_stage_value(double value);
  // Seconds this stage spent waiting for its neighbours and in the schedule, over the steps so far.
  double pipeline_wait_seconds = 0, pipeline_seconds = 0;
  int64_t pipeline_steps = 0;

  // Mean loss over `batches` validation batches (forward only), split across the ranks (with a
  // loss mask: over their trained tokens).
  double evaluate(int64_t batches);
  // The targets of `batch` that are trained (not kIgnoredTarget).
  static int64_t trained_targets(const Batch& batch);
  // Positions per step over the trained tokens of the step on every rank (`trained` this rank's):
  // what the graph's mean over positions is multiplied by to be the mean over trained tokens; 0
  // when no token of the step is trained.
  double trained_normalization(int64_t trained);
  MemoryPlan memory() const { return memory_; }

  const recipe::Recipe& recipe;
  std::unique_ptr<Communicator> own_comm;  // the local one, when none was given
  Communicator& comm;
  int rank, world;
  std::unique_ptr<Dataset> data;
  ModelGraph model;
  OffloadSpec offload;
  std::unique_ptr<OffloadedState> offloaded;  // null without offload
  ParameterStore store;
  std::unique_ptr<Optimizer> optimizer;
  std::string device_note;  // how a GPU run (trainer/device.h) splits its work and reduces, or "" (one rank, ZeRO 0-1)
  Device device;            // where the forward and backward run (trainer/device.h)
  Executor executor;
  ZeroStep zero;
  std::unique_ptr<TensorGroup> tensor_group;  // the tensor-parallel ops' collectives (null without)
  int64_t micro_batch, accumulation;
  LossScaler scaler;
  TensorLayout tensor_layout;  // the step's tensor-parallel group (size 1: none)
  int64_t updates = 0;         // applied optimizer updates (skipped steps do not count)
  // LoRA: the frozen base the run started from, over the whole model whatever the layout
  // (ParameterStore::frozen_hash summed over one replica's ranks), as hex; what checkpoints record.
  std::string frozen_base_digest;
  int64_t frozen_base_elements = 0;

  // fp16 -> bf16 for the rest of the run: the graph's 16-bit values change type (same sizes, so
  // the plan stands), the parameter copies are rounded anew and loss scaling stops.
  void fall_back_to_bf16();

  // A GPU run keeps the model state on the device between steps (optim/device_optimizer.h): the
  // host store and optimizer are brought up to date by sync_host() before anything reads them
  // (checkpoints, exports, digests, tests), and host_changed() says they were written (a restored
  // checkpoint, loaded weights: all of the state), so the next step starts from them, whatever
  // the device held. A caller changing part of the state syncs first. Both are no-ops on the CPU.
  void sync_host();
  void host_changed();
  std::unique_ptr<DeviceOptimizer> device_optimizer;  // null on the CPU and on staged runs
  // A resident run's device communicator (trainer/device.h make_device_collectives), through which
  // the device optimizer reduces each micro-batch's gradients: null on one process by default.
  // Declared after the device optimizer, so it is destroyed first: it drains its operations within
  // the timeout, or aborts them, before the optimizer waits for the stream they are on.
  std::unique_ptr<Communicator> device_collectives;
  double device_update_seconds = 0;  // host time of the device optimizer's steps (norm, clipping, update)

 private:
  StepResult finish_step(double loss, double scale, const StepHooks& hooks);
  StepResult finish_step_on_host(double loss, double scale, const StepHooks& hooks);  // the update's logic
  // The step's end of a resident GPU run with deferred reads: `losses` (placeholders, one per
  // micro-batch) become the kept losses times `loss_factor` once the device has decided.
  StepResult finish_step_on_device(std::vector<double>& losses, double loss_factor, double scale);
  // An fp16 step whose gradients overflowed: the scaler backs off, and at its minimum the run
  // aborts or falls back to bf16 as the recipe says.
  StepResult skip_overflowed_step(StepResult result);
  // What the update decides from the gradients' norm (update_math.h decide_update).
  StepPolicy step_policy(double scale) const;
  bool reads_deferred_ = false;  // this step's micro-batches keep their losses on the device
  void ensure_device_current();
  bool device_current_ = false;  // the device holds the host's latest model state
  bool host_current_ = true;     // the host holds the device's latest model state
  void load_batch(const Batch& batch);
  // The mean over this rank's batch rows of the loss of `plan`'s last run (ZeroStep::mean_loss
  // then averages the ranks' micro-batches).
  double batch_loss(const std::string& plan);
  double mean_of_rows(const float* losses) const;  // of one batch's per-row losses
  MemoryPlan memory_;
  std::vector<int> train_gathers_, eval_gathers_, forward_gathers_;
  // A pipeline stage: each micro-batch's received activation until its backward, and the one to hand on.
  std::vector<std::vector<float>> held_inputs_;
  std::vector<float> handed_on_;
  // A pipeline stage's forward pass alone (the schedule's forward), or the whole step (its backward).
  void pipeline_forward(int64_t step, int64_t micro, const Batch& batch, double loss_scale, const std::string& plan);
  double pipeline_backward(int64_t step, int64_t micro, const Batch& batch, double loss_scale);
  // Adds the first and last stage's gradients of a weight both hold (a tied embedding).
  void sync_tied_gradients();
};

// The recipe's offload section for rank `rank` (its swap files are <nvme_path>/<run name>.rank-<r>.*).
OffloadSpec offload_spec(const recipe::Recipe& recipe, int rank);

}  // namespace engine
