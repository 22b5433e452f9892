// fast_exp (nn/fast_math.h) on 16 floats with AVX-512 instructions, the same bits lane for lane:
// the clamps as min/max (ordered so that NaN passes through), floor as one rounding instruction,
// the same fused multiply-adds, and e 2^n as one vscalefps, which rounds the exact product once,
// as fast_exp's two multiplies by powers of two do (the first is exact). About half of the
// instructions of the auto-vectorised scalar code.
//
// Only for functions compiled for AVX-512 (ENGINE_TARGET_AVX512, core/cpu_isa.h):
//
//   ENGINE_TARGET_AVX512 void exps(float* w, int64_t n) { ... _mm512_storeu_ps(w, fast_exp16(_mm512_loadu_ps(w))); }
#pragma once

#include "core/cpu_isa.h"
#include "nn/fast_math.h"

#if ENGINE_HAS_AVX512_KERNELS
#include <immintrin.h>

namespace engine::ops {

[[gnu::always_inline]] ENGINE_TARGET_AVX512 inline __m512 fast_exp16(__m512 x) {
  // max/min return their second operand when either is NaN: a NaN x stays NaN. (The zero-masked
  // forms with every lane set are the plain instructions; GCC 12 warns about the plain intrinsics'
  // undefined pass-through operand.)
  using namespace exp_constants;
  constexpr __mmask16 all = 0xffff;
  __m512 c = _mm512_maskz_max_ps(all, _mm512_set1_ps(kLowest), x);
  c = _mm512_maskz_min_ps(all, _mm512_set1_ps(kHighest), c);
  const __m512 v = _mm512_fmadd_ps(c, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f));
  const __m512 n = _mm512_maskz_roundscale_ps(all, v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPolynomial[i]));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(all, e, n);
}

}  // namespace engine::ops
#endif
