#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace engine {

LossScaler::LossScaler(const recipe::PrecisionSection& p) {
  if (p.mode != recipe::PrecisionMode::fp16) return;
  enabled_ = true;
  dynamic_ = p.loss_scaling == recipe::LossScaling::dynamic;
  if (!dynamic_) {
    scale_ = p.static_scale;
    return;
  }
  scale_ = std::ldexp(1.0, int(p.initial_scale_power));
  factor_ = p.scale_factor;
  min_scale_ = p.min_scale;
  growth_interval_ = p.growth_interval;
  hysteresis_ = hysteresis_left_ = p.hysteresis;
}

LossScaler::Outcome LossScaler::update(bool overflow) {
  if (!overflow) {
    if (dynamic_ && ++clean_steps_ % growth_interval_ == 0) {
      scale_ *= factor_;
      hysteresis_left_ = hysteresis_;
    }
    return Outcome::applied;
  }
  ++skipped_;
  clean_steps_ = 0;
  if (!dynamic_) return Outcome::skipped;
  if (hysteresis_left_ > 1) {
    --hysteresis_left_;
    return Outcome::skipped;
  }
  if (scale_ <= min_scale_) return Outcome::min_scale;
  scale_ = std::max(scale_ / factor_, min_scale_);
  return Outcome::skipped;
}

void LossScaler::restore(const State& s) {
  if (!s.enabled) disable();
  scale_ = s.scale;
  hysteresis_left_ = s.hysteresis_left;
  clean_steps_ = s.clean_steps;
  skipped_ = s.skipped;
}

void LossScaler::disable() {
  enabled_ = dynamic_ = false;
  scale_ = 1;
}

}  // namespace engine
