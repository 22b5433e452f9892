// Shared by the equivalence, wrap, training and GPU tests: load the quick-start recipe with
// overrides, and run it for a few steps recording losses, gradient norms, gradients and weights.
#pragma once

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "recipe/load.h"
#include "trainer/session.h"

namespace engine::testing {

inline recipe::LoadedRecipe quickstart(std::vector<std::string> overrides) {
  recipe::LoadOptions options;
  options.overrides = std::move(overrides);
  return recipe::load_recipe(std::filesystem::path(ENGINE_SOURCE_DIR) / "recipes/quickstart.yaml", options);
}

struct Run {
  std::vector<double> losses, grad_norms, loss_scales;
  std::vector<bool> skipped;
  std::vector<std::vector<float>> first_gradients;  // every parameter's gradient at step 0
  std::vector<std::vector<float>> weights;          // fp32 masters at the end
  int64_t graph_replays = -1;                       // micro-batches a CUDA graph ran (-1: on the CPU)
  int64_t update_graph_replays = -1;                // optimizer phases a CUDA graph ran
  size_t units = 0;                                 // the model's wrap units
};

// `steps` optimizer steps; micro-batches are read in order (sample-level order is the same for
// any micro-batch size), except those whose optimizer step is in `skip_batches_of` (those steps'
// batches are dropped before training: "a run that never saw them").
// `poison_steps`: steps whose gradients get an inf (even steps) or a NaN (odd) after the backward.
inline Run run(const recipe::Recipe& r, int64_t steps, const std::set<int64_t>& poison_steps = {},
               const std::set<int64_t>& skip_batches_of = {}) {
  Session session(r);
  session.store.initialize(uint64_t(r.run.seed));
  Run out;
  out.units = session.model.graph.units().size();
  int64_t index = 0;
  Session::StepHooks step_hooks;
  for (int64_t step = 0; step < steps; ++step) {
    while (skip_batches_of.count(index / session.accumulation)) index += session.accumulation;
    // A hook only where it reads or poisons the gradients: a GPU step without one decides its
    // update on the device (Session::finish_step_on_device), the other path.
    step_hooks.after_backward = nullptr;
    if (step == 0 || poison_steps.count(step))
      step_hooks.after_backward = [&, step] {
        if (step == 0)
          for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
            const float* g = session.store.grad(int(i));
            out.first_gradients.emplace_back(g, g + session.store.numel(int(i)));
          }
        if (poison_steps.count(step)) session.store.grad(0)[0] = step % 2 ? NAN : INFINITY;
      };
    auto result = session.train_step(
        step,
        [&] {
          Batch batch(session.micro_batch, session.model.sequence, session.data->features());
          session.data->fill(Split::train, index++, batch);
          return batch;
        },
        step_hooks);
    out.losses.push_back(result.loss);
    out.grad_norms.push_back(result.grad_norm);
    out.loss_scales.push_back(result.loss_scale);
    out.skipped.push_back(result.skipped);
  }
  session.sync_host();  // a GPU run's weights, from the device
  if (DeviceRunner* runner = session.executor.runner()) out.graph_replays = runner->graph_replays();
  if (session.device_optimizer) out.update_graph_replays = session.device_optimizer->graph_replays();
  for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
    const float* w = session.store.param(int(i));
    out.weights.emplace_back(w, w + session.store.numel(int(i)));
  }
  return out;
}

// Largest |a - b| / max|b| over one tensor.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace engine::testing
