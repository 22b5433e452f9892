// Optimizer update kernels: the element-wise AdamW and SGD updates over flat fp32 arrays, as one
// vectorised, multi-threaded CPU kernel each. The in-memory optimizer (optimizer.cpp) calls them per
// weight-decay segment; an optimizer that streams its state in chunks calls them per chunk, and gets
// the same bits, because every element's update depends only on that element.
//
//   AdamWScalars s = adamw_scalars(config, lr, t, /*decay=*/true);
//   adamw_update(w, g, m, v, n, s);        // one step over n parameters, in place
//
// The arithmetic is fixed, with explicit fused multiply-adds, so the AVX-512, AVX2 and scalar paths,
// and any split of the array into chunks or threads, give the same bits:
//
//   AdamW:  m = fma(beta1, m, one_minus_beta1 * g)
//           v = fma(beta2, v, (one_minus_beta2 * g) * g)
//           w = fma(-decay, w, w)                          decoupled weight decay, decay = lr * wd
//           d = fma(sqrt(v), denom_scale, eps)
//           w = fma(-step_size, m / d, w)
//   SGD:    d = fma(decay, w, g)                           L2 decay: g + wd * w
//           with a buffer: buf = first ? d : fma(momentum, buf, d)
//                          d = nesterov ? fma(momentum, buf, d) : buf
//           w = fma(-lr, d, w)
//
// The widest path this CPU runs is chosen once, at the first call (AVX-512F, else AVX2 + FMA, else
// scalar); optim/update_kernels_isa.h runs a given path, for tests and benchmarks.
#pragma once

#include <cstdint>

#include "recipe/recipe.h"

namespace engine {

struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, denom_scale, decay;
};

// The scalars of AdamW step `t` (counted from 1) at learning rate `lr`: step_size = lr / (1 - beta1^t)
// and denom_scale = 1 / sqrt(1 - beta2^t), computed in double and then rounded; decay = lr * weight
// decay for parameters that decay, else 0.
AdamWScalars adamw_scalars(const recipe::OptimizerSection& config, double lr, int64_t t, bool decay);

// One AdamW step over n parameters: w (weights), g (gradients), m and v (first and second moments).
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

struct SgdScalars {
  float lr, decay, momentum;
  bool nesterov, first;  // first: the first step, which starts the momentum buffer at the gradient
};

// One SGD step over n parameters; momentum_buffer is null without momentum.
void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s);

}  // namespace engine
