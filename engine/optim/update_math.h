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

}  // namespace engine
