// The optimizer step's element math, written once for the CPU (optim/update_kernels.cpp's scalar
// path, optimizer.cpp's norm partials) and the CUDA kernels (optim/update_kernels.cu): the same
// operations in the same order, with the fused multiply-adds written out (the CPU file is built with
// -ffp-contract=off, CUDA sources with -fmad=false), so both devices give the same bits. The
// AVX-512 and AVX2 paths of update_kernels.cpp spell the same sequence in intrinsics.
//
//   adamw_element(w[k], g[k], m[k], v[k], s);      // update_kernels.h's AdamW, one element
//   sgd_element(w[k], g[k], buf ? &buf[k] : nullptr, s);
//   double sq = block_squares(x);                  // one kShardBlock block's sum of squares
//
// fmaf and sqrtf round once (IEEE): on the CPU the FMA and sqrt instructions or libm, on the GPU
// fma.rn.f32 and sqrt.rn.f32 (without fast math); `/` is the IEEE division on both.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "dist/shard_layout.h"
#include "optim/update_kernels.h"

namespace engine {

// AdamW (update_kernels.h): m and v updated, then decoupled decay and the step on w.
ENGINE_HOST_DEVICE inline void adamw_element(float& w, float g, float& m, float& v, const AdamWScalars& s) {
  const float mk = fmaf(s.beta1, m, s.one_minus_beta1 * g);
  const float vk = fmaf(s.beta2, v, (s.one_minus_beta2 * g) * g);
  const float wk = fmaf(-s.decay, w, w);
  const float d = fmaf(sqrtf(vk), s.denom_scale, s.eps);
  w = fmaf(-s.step_size, mk / d, wk);
  m = mk;
  v = vk;
}

// SGD (update_kernels.h): L2 decay into the gradient, the momentum buffer (`buf` null without
// momentum), then the step on w.
ENGINE_HOST_DEVICE inline void sgd_element(float& w, float g, float* buf, const SgdScalars& s) {
  float d = fmaf(s.decay, w, g);
  if (buf) {
    const float b = s.first ? d : fmaf(s.momentum, *buf, d);
    *buf = b;
    d = s.nesterov ? fmaf(s.momentum, b, d) : b;
  }
  w = fmaf(-s.lr, d, w);
}

// ---- The gradient norm's block sums (optimizer.h gradient_norm_partials) ---------------------------
//
// One block of kShardBlock elements sums its squares in double in 16 interleaved lanes (lane j takes
// elements j, j + 16, j + 32, ... in that order), then adds the lanes in a fixed tree: width 8, 4, 2,
// 1, lane j += lane j + width. A float's square is exact in double, so the step rounds once (an FMA
// would give the same bits). A device kernel may run the lanes on 16 threads and the tree as
// shuffles: the same additions in the same order.
inline constexpr int kSquareLanes = 16;
static_assert(kShardBlock % kSquareLanes == 0);

ENGINE_HOST_DEVICE inline double add_square(double lane, float x) { return lane + double(x) * double(x); }

ENGINE_HOST_DEVICE inline double block_squares(const float* x) {
  double lanes[kSquareLanes] = {};
  for (int64_t k = 0; k < kShardBlock; k += kSquareLanes) {
#if defined(_OPENMP)  // the CPU's vectorised lanes (not in CUDA sources)
#pragma omp simd
#endif
    for (int j = 0; j < kSquareLanes; ++j) lanes[j] = add_square(lanes[j], x[k + j]);
  }
  for (int width = kSquareLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

// ---- The norm from its partial sums, and what the step does with it ---------------------------------
//
// sum_norm_partials (optimizer.h) adds the partials in chunks of kNormChunk, each chunk in order,
// then the chunks' sums in order: a GPU adds the chunks in parallel and their sums on one thread,
// the same additions in the same order (update_kernels.cu decide_update).
inline constexpr int64_t kNormChunk = 256;

ENGINE_HOST_DEVICE inline int64_t norm_chunks(int64_t partials) { return (partials + kNormChunk - 1) / kNormChunk; }

// Chunk `c` of `n` partials, added in order.
ENGINE_HOST_DEVICE inline double norm_chunk_sum(const double* partials, int64_t n, int64_t c) {
  double sum = 0;
  const int64_t end = (c + 1) * kNormChunk < n ? (c + 1) * kNormChunk : n;
  for (int64_t k = c * kNormChunk; k < end; ++k) sum += partials[k];
  return sum;
}

// The chunks' sums added in order.
ENGINE_HOST_DEVICE inline double sum_in_order(const double* x, int64_t n) {
  double sum = 0;
  for (int64_t k = 0; k < n; ++k) sum += x[k];
  return sum;
}

// Clipping's factor for the global norm `norm`: 1 when no clipping applies.
ENGINE_HOST_DEVICE inline double clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

// What a step does once its gradients' norm is known. The gradients were computed at `loss_scale`
// (1 without fp16's dynamic scaling), so their norm `scaled_norm` is the loss scale times the true
// one. With `skip_non_finite` (fp16's scaler), an overflow (a norm that is not finite) skips the
// update; otherwise the update takes the gradients times `factor`: clipping's factor for the true
// norm, over the loss scale.
struct StepPolicy {
  double loss_scale = 1.0, max_norm = 0.0;
  int32_t skip_non_finite = 0;
};
struct UpdateDecision {
  double scaled_norm = 0, grad_norm = 0, factor = 1.0;
  int32_t skip = 0;
};

ENGINE_HOST_DEVICE inline UpdateDecision decide_update(double scaled_norm, const StepPolicy& policy) {
  UpdateDecision d;
  d.scaled_norm = scaled_norm;
  const bool finite = scaled_norm - scaled_norm == 0.0;  // false for an infinity or a NaN
  if (policy.skip_non_finite && !finite) {
    d.grad_norm = scaled_norm;
    d.skip = 1;
    return d;
  }
  d.grad_norm = scaled_norm / policy.loss_scale;
  d.factor = clip_factor(d.grad_norm, policy.max_norm) / policy.loss_scale;
  return d;
}

}  // namespace engine
