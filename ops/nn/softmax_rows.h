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
// the same bits at every width (fast_exp8 and fast_exp16 are its vector twins).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/cpu_isa.h"
#include "nn/fast_math.h"
#include "nn/fast_math_avx2.h"
#include "nn/fast_math_avx512.h"

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

// The sum of w[0, n) in the lanes' order.
[[gnu::always_inline]] inline float row_sum(const float* w, int64_t n) {
  float lanes[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) lanes[j] += w[i + j];
  for (int j = 0; i + j < n; ++j) lanes[j] += w[i + j];
  return lane_total(lanes);
}

// w[i] = exp(w[i] - shift) for i < n; returns their sum. With AVX2, two fast_exp8 vectors make
// the 16 lanes (the first 8 and the last 8).
[[gnu::always_inline]] inline float exp_row_sum(float* w, int64_t n, float shift) {
  float lanes[kRowLanes] = {};
  int64_t i = 0;
#if ENGINE_HAS_FAST_EXP8
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + kRowLanes <= n; i += kRowLanes) {
    const __m256 e_low = fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(w + i), s));
    const __m256 e_high = fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(w + i + 8), s));
    _mm256_storeu_ps(w + i, e_low);
    _mm256_storeu_ps(w + i + 8, e_high);
    low = _mm256_add_ps(low, e_low);
    high = _mm256_add_ps(high, e_high);
  }
  _mm256_storeu_ps(lanes, low);
  _mm256_storeu_ps(lanes + 8, high);
#else
  for (; i + kRowLanes <= n; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) {
      const float e = fast_exp(w[i + j] - shift);
      w[i + j] = e;
      lanes[j] += e;
    }
#endif
  for (int j = 0; i + j < n; ++j) {
    const float e = fast_exp(w[i + j] - shift);
    w[i + j] = e;
    lanes[j] += e;
  }
  return lane_total(lanes);
}

// w[i] = exp(w[i] - shift) for i < n.
[[gnu::always_inline]] inline void exp_row(float* w, int64_t n, float shift) {
  int64_t i = 0;
#if ENGINE_HAS_FAST_EXP8
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(w + i, fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(w + i), s)));
#endif
#pragma omp simd
  for (int64_t j = i; j < n; ++j) w[j] = fast_exp(w[j] - shift);
}

// exp_row_sum and w[i] = exp(w[i] - shift) with fast_exp16 (nn/fast_math_avx512.h): the same bits,
// for the AVX-512 instantiations of the kernels (`if constexpr (wide)` in a template that only an
// ENGINE_TARGET_AVX512 wrapper instantiates with wide = true). Not always-inline: GCC inlines a
// function with more target features only into a function that has them, so these are inlined
// once their caller has been inlined into its AVX-512 wrapper, or else called.
#if ENGINE_HAS_AVX512_KERNELS
ENGINE_TARGET_AVX512 inline float exp_row_sum16(float* w, int64_t n, float shift) {
  __m512 sum = _mm512_setzero_ps();
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes) {
    const __m512 e = fast_exp16(_mm512_sub_ps(_mm512_loadu_ps(w + i), s));
    _mm512_storeu_ps(w + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  float lanes[kRowLanes];
  _mm512_storeu_ps(lanes, sum);
  for (int j = 0; i + j < n; ++j) {
    const float e = fast_exp(w[i + j] - shift);
    w[i + j] = e;
    lanes[j] += e;
  }
  return lane_total(lanes);
}

ENGINE_TARGET_AVX512 inline void exp_row16(float* w, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    _mm512_storeu_ps(w + i, fast_exp16(_mm512_sub_ps(_mm512_loadu_ps(w + i), s)));
  for (; i < n; ++i) w[i] = fast_exp(w[i] - shift);
}
#else
inline float exp_row_sum16(float* w, int64_t n, float shift) { return exp_row_sum(w, n, shift); }
inline void exp_row16(float* w, int64_t n, float shift) { exp_row(w, n, shift); }
#endif

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
