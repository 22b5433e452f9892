// LossScaler: fp16 loss scaling. The loss gradient is multiplied by the scale so that small
// gradients survive fp16's range; before the update the gradients are divided by it again.
// A step whose gradients overflow (inf or NaN anywhere) is skipped: no update, no optimizer or
// scheduler step, counted in skipped().
//
// Dynamic scaling follows DeepSpeed's and Megatron's scaler: start at 2^initial_scale_power;
// after `growth_interval` consecutive clean steps multiply by `scale_factor`; on an overflow,
// spend one unit of hysteresis, and when none is left divide by `scale_factor` (never below
// `min_scale`). The hysteresis refills when the scale grows. An overflow at min_scale is
// reported by update() returning Outcome::min_scale so the trainer can abort or fall back to bf16.
//
//   LossScaler scaler(recipe.precision);
//   executor.run("train", step, micro_step, float(scaler.scale()));   // the loss gradient, scaled
//   const bool overflow = !std::isfinite(zero.gradient_norm());
//   if (scaler.update(overflow) == LossScaler::Outcome::min_scale) ...
//
// (trainer/session.cpp finish_step_on_host does this; tests/core/header_examples_test.cpp runs the
// scaler's part.)
#pragma once

#include <cstdint>

#include "recipe/recipe.h"

namespace engine {

class LossScaler {
 public:
  // fp32 and bf16 runs get a scaler whose scale is 1 and never changes.
  explicit LossScaler(const recipe::PrecisionSection& precision);

  double scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  int64_t skipped() const { return skipped_; }

  enum class Outcome { applied, skipped, min_scale };
  // Records one step's result: `overflow` means its gradients held inf or NaN.
  Outcome update(bool overflow);
  // The fp16 -> bf16 fallback: no scaling from here on.
  void disable();

  // What evolves during a run, for checkpoints (the rest comes from the recipe).
  struct State {
    bool enabled = false;
    double scale = 1;
    int64_t hysteresis_left = 1, clean_steps = 0, skipped = 0;
  };
  State state() const { return {enabled_, scale_, hysteresis_left_, clean_steps_, skipped_}; }
  void restore(const State& s);

 private:
  bool enabled_ = false, dynamic_ = false;
  double scale_ = 1, factor_ = 2, min_scale_ = 1;
  int64_t growth_interval_ = 1000, hysteresis_ = 1, hysteresis_left_ = 1;
  int64_t clean_steps_ = 0, skipped_ = 0;
};

}  // namespace engine
