// Vectorisable exp and tanh for the hot loops of CPU kernels.
//
// libm's expf/tanhf are scalar calls that stop the compiler from vectorising a loop; these are
// plain arithmetic (range reduction to [-ln2/2, ln2/2], a degree-6 polynomial, 2^n built in the
// exponent bits), so `#pragma omp simd` loops using them run at full vector width.
//
// Accuracy: fast_exp is within 2 ulp of exp over the float range, subnormal results included.
// fast_tanh is within 2 ulp where |tanh x| >= 1/2; nearer 0 its error is absolute, about one ulp
// of 1 (1 - 2/(e^2x + 1) cancels), which is what its users need (GELU adds it to 1).
//
// Every input is defined, with the values of std::exp / std::tanh at the edges: NaN gives NaN,
// exp(+inf) = +inf, exp(-inf) = 0, exp overflows to +inf above ln(FLT_MAX) and underflows
// gradually to 0; tanh(+-inf) = +-1. (A hostile weights file can put NaN anywhere, and converting
// a NaN or out-of-range float to int is undefined behaviour, so there is no such conversion.)
#pragma once

#include <bit>
#include <cstdint>

#include "core/host_device.h"

namespace engine::ops {

// fast_exp's constants, shared with its vector twins (nn/fast_math_avx2.h, nn/fast_math_avx512.h).
namespace exp_constants {
// Beyond these bounds exp is 0 (below ln of half the smallest subnormal) or +inf in float.
inline constexpr float kLowest = -104.0f, kHighest = 89.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;  // ln 2 split in two
// exp(r) = 1 + r + r^2 (p(r)), p's coefficients from the highest power down (Horner).
inline constexpr float kPolynomial[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_constants

// A fused multiply-add a * b + c rounded once, and x rounded to the nearest integer (ties to even),
// on the CPU (GCC builtins: inline instructions that vectorise) and in CUDA device code alike.
ENGINE_HOST_DEVICE inline float fused_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
ENGINE_HOST_DEVICE inline float round_to_integer(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);
#endif
}

// The multiply-adds are explicit fused ones (fused_multiply_add), so every compiler, every vector
// width and the CUDA kernels (ENGINE_HOST_DEVICE; built with -fmad=false) compute the same bits;
// fast_exp8 and fast_exp16 (nn/fast_math_avx2.h, nn/fast_math_avx512.h) are its vector twins.
ENGINE_HOST_DEVICE inline float fast_exp(float x) {
  using namespace exp_constants;
  // NaN fails both comparisons and flows through the arithmetic to a NaN result.
  float c = x < kLowest ? kLowest : x;
  c = c > kHighest ? kHighest : c;
  const float v = fused_multiply_add(c, kLog2e, 0.5f);
  // n = floor(v), in [-150, 128] (or NaN), from rint: GCC makes floorf a library call (which stops
  // vectorisation) unless its result is converted to int, and there is no such conversion here.
  float n = round_to_integer(v);
  n = n > v ? n - 1.0f : n;
  float r = fused_multiply_add(-n, kLn2High, c);  // ln 2 in two parts for an exact reduction
  r = fused_multiply_add(-n, kLn2Low, r);
  // A local copy: CUDA device code may read a namespace-scope constexpr scalar but not an array.
  constexpr float kP[6] = {kPolynomial[0], kPolynomial[1], kPolynomial[2],
                           kPolynomial[3], kPolynomial[4], kPolynomial[5]};
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = fused_multiply_add(p, r, kP[i]);
  const float e = fused_multiply_add(p * r, r, r) + 1.0f;
  // n as an integer without converting a float to int (undefined for NaN): adding 1.5 * 2^23 puts
  // the integer n in the low mantissa bits. For NaN the bits are meaningless, and unused: e is NaN.
  const auto k = static_cast<int32_t>(std::bit_cast<uint32_t>(n + 12582912.0f) - 0x4b400000u);
  // 2^n as two normal powers of two, 2^(n/2) 2^(n - n/2): the first product is exact and the
  // second rounds once, so results that leave the normal range become subnormal, 0 or +inf as
  // exp's do (inside it the value is bit for bit e * 2^n).
  const int32_t k1 = k >> 1, k2 = k - k1;
  const auto s1 = std::bit_cast<float>(static_cast<uint32_t>(k1 + 127) << 23);
  const auto s2 = std::bit_cast<float>(static_cast<uint32_t>(k2 + 127) << 23);
  return e * s1 * s2;
}

ENGINE_HOST_DEVICE inline float fast_tanh(float x) {
  const float a = x < 0 ? -x : x;
  const float t = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);  // +inf: 1 - 2/inf = 1; NaN stays NaN
  return x < 0 ? -t : t;
}

}  // namespace engine::ops
