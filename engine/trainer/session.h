// Session: everything a recipe compiles into, ready to step. Building one validates the data,
// builds the model graph, differentiates it, plans memory for training and evaluation, and
// allocates parameters, gradients, optimizer state and the activation arena, once.
//
//   Session session(loaded.recipe, loaded.world);
//   session.store.initialize(seed);
//   double loss = session.train_micro_batch(batch, step, micro);   // mean loss of the micro-batch
//   MemoryPlan memory = session.memory();
#pragma once

#include <functional>
#include <memory>

#include "data/dataset.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "recipe/load.h"
#include "runtime/executor.h"
#include "runtime/parameters.h"

namespace engine {

struct MemoryPlan {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, inputs = 0;
  int64_t total() const { return parameters + gradients + optimizer_state + activations + inputs; }
};

// What a recipe compiles into before anything is allocated: the differentiated model graph and the
// plans of a training and an evaluation step. `engine plan` stops here.
struct CompiledStep {
  ModelGraph model;
  Plan train, eval;
  MemoryPlan memory;
  double flops_per_micro_batch = 0;  // forward + backward, counted from the graph's nodes
};
CompiledStep compile_step(const recipe::Recipe& recipe);

// Throws UserError when the plan needs more memory than the machine has available.
void check_memory_available(const MemoryPlan& memory);

class Session {
 public:
  explicit Session(const recipe::Recipe& recipe);
  Session(const recipe::Recipe& recipe, CompiledStep compiled);

  // Forward and backward of one micro-batch (gradients accumulate); returns its mean loss.
  double train_micro_batch(const Batch& batch, int64_t step, int64_t micro);

  struct StepResult {
    double loss;       // mean over the step's micro-batches
    double grad_norm;  // global L2 norm before clipping
    double lr;
  };
  // One optimizer step: zero the gradients, run every micro-batch from `next_batch`, clip, update.
  // `engine train`, `engine golden` and the tests all step through here.
  // `after_backward`, when given, sees the accumulated gradients before clipping and the update.
  template <class NextBatch>
  StepResult train_step(int64_t step, NextBatch&& next_batch, const std::function<void()>& after_backward = {}) {
    store.zero_grads();
    double loss = 0;
    for (int64_t micro = 0; micro < accumulation; ++micro)
      loss += train_micro_batch(next_batch(), step, micro) / double(accumulation);
    if (after_backward) after_backward();
    StepResult result{loss, clip_gradients(store, recipe.train.gradient_clipping), learning_rate(recipe, step)};
    optimizer->step(result.lr);
    return result;
  }
  // Mean loss over `batches` validation batches (forward only).
  double evaluate(int64_t batches);
  MemoryPlan memory() const { return memory_; }

  const recipe::Recipe& recipe;
  std::unique_ptr<Dataset> data;
  ModelGraph model;
  ParameterStore store;
  std::unique_ptr<Optimizer> optimizer;
  Executor executor;
  int64_t micro_batch, accumulation;

 private:
  void load_batch(const Batch& batch);
  double mean_loss(const std::string& plan);
  MemoryPlan memory_;
};

}  // namespace engine
