// Row loops of the softmax-shaped kernels (cross-entropy, attention): the max of a row, its
// exponentials and their sum, and the softmax backward of a row.
//
// They are always inlined, so that a kernel compiles them at the width of the function it calls
// them from: its AVX2 wrapper, or its AVX-512 one (ENGINE_TARGET_AVX512, core/cpu_isa.h):
//
//   ENGINE_TARGET_AVX512 float row_avx512(float* w, int64_t n) {
//     const float top = row_max(w, n);
//     return exp_row_sum(w, n, top);   // w[i] = exp(w[i] - top)
//   }
//
// Sums run over kRowLanes interleaved lanes (lane j takes elements j, j + 16, ...; a tail shorter
// than 16 goes to the first lanes) added in a fixed tree at the end, so the AVX2 build (two 8-float
// vectors) and the AVX-512 one (one 16-float vector) give the same bits; a row is summed by one
// thread, so thread counts do not change them either. Exponentials are fast_exp's (nn/fast_math.h),
// the same bits at every width.
#pragma once

#include <cmath>
#include <cstdint>

#include "nn/fast_math.h"

namespace engine::ops {

inline constexpr int kRowLanes = 16;

// The largest element of w[0, n) (-inf for n = 0). NaN elements are skipped; a row with a NaN still
// gives a NaN softmax, through its exponential.
[[gnu::always_inline]] inline float row_max(const float* w, int64_t n) {
  float lanes[kRowLanes];
  for (int j = 0; j < kRowLanes; ++j) lanes[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) lanes[j] = lanes[j] > w[i + j] ? lanes[j] : w[i + j];
  for (int j = 0; i + j < n; ++j) lanes[j] = lanes[j] > w[i + j] ? lanes[j] : w[i + j];
  float top = lanes[0];
  for (int j = 1; j < kRowLanes; ++j) top = top > lanes[j] ? top : lanes[j];
  return top;
}

// The lanes' sum in the fixed tree order (lanes is consumed).
[[gnu::always_inline]] inline float lane_total(float* lanes) {
  for (int width = kRowLanes / 2; width > 0; width /= 2)
#pragma omp simd
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

// w[i] = exp(w[i] - shift) for i < n; returns their sum.
[[gnu::always_inline]] inline float exp_row_sum(float* w, int64_t n, float shift) {
  float lanes[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) {
      const float e = fast_exp(w[i + j] - shift);
      w[i + j] = e;
      lanes[j] += e;
    }
  for (int j = 0; i + j < n; ++j) {
    const float e = fast_exp(w[i + j] - shift);
    w[i + j] = e;
    lanes[j] += e;
  }
  return lane_total(lanes);
}

// The softmax backward of one row, in place: dp[i] = p[i] (dp[i] - delta), delta = sum p[i] dp[i].
[[gnu::always_inline]] inline void softmax_backward_row(const float* p, float* dp, int64_t n) {
  float lanes[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) lanes[j] += p[i + j] * dp[i + j];
  for (int j = 0; i + j < n; ++j) lanes[j] += p[i + j] * dp[i + j];
  const float delta = lane_total(lanes);
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) dp[k] = p[k] * (dp[k] - delta);
}

}  // namespace engine::ops
