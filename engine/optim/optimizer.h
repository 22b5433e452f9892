// Optimizers, learning-rate schedules and gradient clipping, over a ParameterStore.
//
//   auto optimizer = make_optimizer(recipe.optimizer, store);
//   const double norm = zero.gradient_norm();   // global L2 norm, every rank (dist/zero_step.h)
//   scale_gradients(store, clip_factor(norm, recipe.train.gradient_clipping));
//   optimizer->step(learning_rate(recipe, step));
//
// (tests/core/header_examples_test.cpp compiles and runs this with one rank's gradient_norm.)
//
// AdamW decouples weight decay (w -= lr * wd * w) and corrects the moment estimates' bias; SGD
// supports momentum, Nesterov and L2 weight decay (PyTorch's torch.optim.SGD semantics). Biases
// and normalisation weights get no weight decay unless optimizer.decay_norms_and_biases.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optim/update_math.h"
#include "recipe/recipe.h"
#include "runtime/parameters.h"

namespace engine {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr`; `step` counts updates from 1.
  virtual void step(double lr) = 0;
  // Optimizer state, for checkpoints and `engine plan`.
  virtual int64_t state_bytes() const = 0;
  // The state tensors by their PyTorch names, each one fp32 buffer per unit over the unit's
  // optimizer range: AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer (none without momentum).
  // Offloaded state has no buffers in memory: kind `offloaded_kind` of `offloaded` holds it.
  struct StateTensor {
    std::string name;
    std::vector<float*> units;
    class OffloadedState* offloaded = nullptr;
    size_t offloaded_kind = 0;
  };
  virtual std::vector<StateTensor> state() = 0;
  // Updates applied so far (AdamW's bias correction, SGD's first-step buffer), for resuming.
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;
  // Whether step() also writes the parameter copies (then the caller skips refresh_copies()).
  virtual bool writes_copies() const { return false; }
};

// How many fp32 state tensors per parameter the optimizer keeps (AdamW 2, SGD 1 with momentum, else 0).
inline int optimizer_state_tensors(const recipe::OptimizerSection& o) {
  if (o.type == recipe::OptimizerType::adamw) return 2;  // first and second moments
  return o.momentum > 0 ? 1 : 0;                         // momentum buffer
}

// A run of elements of one unit's optimizer range with one weight-decay setting.
struct Segment {
  size_t unit;
  int64_t begin, end;  // elements from the start of the unit's optimizer range
  bool decay;
};
// The optimizer range of every unit cut where weight decay changes: parameters that decay, and
// everything else (parameters that do not, the padding between and after them).
std::vector<Segment> decay_segments(const ParameterStore& store, const recipe::OptimizerSection& config);

std::unique_ptr<Optimizer> make_optimizer(const recipe::OptimizerSection& config, ParameterStore& store);

// The learning rate of optimizer step `step` (0-based) under the recipe's schedule.
double learning_rate(const recipe::Recipe& recipe, int64_t step);

// Clipping: clip_factor (update_math.h) brings the global L2 norm (ZeroStep::gradient_norm, the one
// gradient norm at every world size and stage) to max_norm; decide_update divides it by the loss
// scale where fp16 scales; scale_gradients applies it.
void scale_gradients(ParameterStore& store, double factor);  // every gradient *= factor

// The norm at any world size and stage: one sum of squares (in double) per kShardBlock elements of
// this rank's shard (shard_layout.h), in unit and block order; the ranks' partials, gathered in
// rank order, less each unit's padding blocks (zero_step.h without_padding_blocks), make the same
// list at every world size, and sum_norm_partials adds it in one fixed order:
// chunks of kNormChunk (256) partials each in order, then the chunks' sums in order (update_math.h;
// a GPU adds the chunks in parallel). Up to 256 partials (262,144 parameters) that is the list's order.
// With tensor parallelism, `whole_weights` false leaves the replicated weights out (every rank of the
// tensor-parallel group but one), so that the group's partials summed count each of them once.
std::vector<double> gradient_norm_partials(const ParameterStore& store, bool whole_weights = true);
// The same partial sums over the fp32 masters (each non-null: not offloaded).
std::vector<double> master_norm_partials(const ParameterStore& store);
double sum_norm_partials(const std::vector<double>& partials);

}  // namespace engine
