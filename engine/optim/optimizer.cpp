#include "optim/optimizer.h"

#include <cmath>
#include <numbers>

namespace engine {

namespace {

bool decays(const ParameterStore& store, int index, const recipe::OptimizerSection& config) {
  return config.decay_norms_and_biases || store.graph().params()[size_t(index)].decay;
}

class AdamW : public Optimizer {
 public:
  AdamW(const recipe::OptimizerSection& config, ParameterStore& store) : config_(config), store_(store) {
    for (const Unit& unit : store.graph().units()) {
      m_.emplace_back(unit.numel * 4);
      v_.emplace_back(unit.numel * 4);
    }
  }

  void step(double lr) override {
    ++t_;
    const double beta1 = config_.betas[0], beta2 = config_.betas[1];
    const double correction1 = 1.0 - std::pow(beta1, double(t_));
    const double correction2 = 1.0 - std::pow(beta2, double(t_));
    const auto& params = store_.graph().params();
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      float* w = store_.param(int(i));
      const float* g = store_.grad(int(i));
      float* m = m_[size_t(p.unit)].f32() + p.offset;
      float* v = v_[size_t(p.unit)].f32() + p.offset;
      const float decay = decays(store_, int(i), config_) ? float(lr * config_.weight_decay) : 0.0f;
      const float b1 = float(beta1), b2 = float(beta2), eps = float(config_.eps);
      const float step_size = float(lr / correction1), denom_scale = float(1.0 / std::sqrt(correction2));
      const int64_t n = store_.numel(int(i));
#pragma omp parallel for simd schedule(static)
      for (int64_t k = 0; k < n; ++k) {
        m[k] = b1 * m[k] + (1.0f - b1) * g[k];
        v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
        w[k] -= decay * w[k];
        w[k] -= step_size * m[k] / (std::sqrt(v[k]) * denom_scale + eps);
      }
    }
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const Buffer& b : m_) n += 2 * b.bytes();
    return n;
  }

 private:
  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  std::vector<Buffer> m_, v_;
  int64_t t_ = 0;
};

class Sgd : public Optimizer {
 public:
  Sgd(const recipe::OptimizerSection& config, ParameterStore& store) : config_(config), store_(store) {
    if (config.momentum > 0)
      for (const Unit& unit : store.graph().units()) momentum_.emplace_back(unit.numel * 4);
  }

  void step(double lr) override {
    ++t_;
    const auto& params = store_.graph().params();
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      float* w = store_.param(int(i));
      const float* g = store_.grad(int(i));
      float* buf = momentum_.empty() ? nullptr : momentum_[size_t(p.unit)].f32() + p.offset;
      const float decay = decays(store_, int(i), config_) ? float(config_.weight_decay) : 0.0f;
      const float mu = float(config_.momentum), rate = float(lr);
      const bool nesterov = config_.nesterov, first = t_ == 1;
      const int64_t n = store_.numel(int(i));
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < n; ++k) {
        float d = g[k] + decay * w[k];
        if (buf) {
          buf[k] = first ? d : mu * buf[k] + d;  // PyTorch starts the buffer at the first gradient
          d = nesterov ? d + mu * buf[k] : buf[k];
        }
        w[k] -= rate * d;
      }
    }
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const Buffer& b : momentum_) n += b.bytes();
    return n;
  }

 private:
  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  std::vector<Buffer> momentum_;
  int64_t t_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const recipe::OptimizerSection& config, ParameterStore& store) {
  if (config.type == recipe::OptimizerType::sgd) return std::make_unique<Sgd>(config, store);
  return std::make_unique<AdamW>(config, store);
}

double learning_rate(const recipe::Recipe& recipe, int64_t step) {
  const double peak = recipe.optimizer.lr;
  const auto& s = recipe.scheduler;
  if (step < s.warmup_steps) return peak * double(step + 1) / double(s.warmup_steps);
  if (s.type == recipe::SchedulerType::constant) return peak;
  // Decay over the steps after warmup, reaching min_lr after the last one (as nanoGPT and
  // PyTorch's CosineAnnealingLR do): the last step still learns, and a single step runs at the peak.
  const int64_t decay_steps = recipe.train.steps - s.warmup_steps;
  const double progress = double(step - s.warmup_steps) / double(decay_steps);
  const double factor =
      s.type == recipe::SchedulerType::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return s.min_lr + (peak - s.min_lr) * factor;
}

double gradient_norm(const ParameterStore& store) {
  double sum = 0;
  for (const Buffer& unit : const_cast<ParameterStore&>(store).grad_units()) {
    const float* g = unit.f32();
    const int64_t n = unit.bytes() / 4;
    for (int64_t k = 0; k < n; ++k) sum += double(g[k]) * g[k];
  }
  return std::sqrt(sum);
}

void scale_gradients(ParameterStore& store, double factor) {
  const auto scale = float(factor);
  for (Buffer& unit : store.grad_units()) {
    float* g = unit.f32();
    const int64_t n = unit.bytes() / 4;
#pragma omp parallel for simd schedule(static)
    for (int64_t k = 0; k < n; ++k) g[k] *= scale;
  }
}

double clip_factor(double norm, double max_norm) { return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0; }

double clip_gradients(ParameterStore& store, double max_norm) {
  const double norm = gradient_norm(store);
  if (double factor = clip_factor(norm, max_norm); factor != 1.0) scale_gradients(store, factor);
  return norm;
}

}  // namespace engine
