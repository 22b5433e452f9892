#include "core/convert.h"

#include <immintrin.h>

#include <bit>
#include <cstring>

namespace engine {

namespace {

// The same arithmetic as float_to_bf16, written so the compiler vectorises the loop.
inline uint16_t round_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace

void widen(const void* src, DType type, float* dst, int64_t n, bool accumulate) {
  switch (type) {
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) {
        const float v = std::bit_cast<float>(uint32_t(s[i]) << 16);
        dst[i] = accumulate ? dst[i] + v : v;
      }
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t vectorised = 0;
#ifdef __F16C__
      vectorised = n / 8 * 8;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t block = 0; block < n / 8; ++block) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + block * 8)));
        if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(dst + block * 8));
        _mm256_storeu_ps(dst + block * 8, v);
      }
#endif
      for (int64_t i = vectorised; i < n; ++i) dst[i] = (accumulate ? dst[i] : 0.0f) + f16_to_float(s[i]);
      return;
    }
    default: {
      const auto* s = static_cast<const float*>(src);
      if (!accumulate) {
        std::memcpy(dst, s, size_t(n) * 4);
        return;
      }
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) dst[i] += s[i];
      return;
    }
  }
}

void narrow(const float* src, void* dst, DType type, int64_t n) {
  switch (type) {
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] = round_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t vectorised = 0;
#ifdef __F16C__
      vectorised = n / 8 * 8;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t block = 0; block < n / 8; ++block) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + block * 8), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + block * 8), h);
      }
#endif
      for (int64_t i = vectorised; i < n; ++i) d[i] = float_to_f16(src[i]);
      return;
    }
    default:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
  }
}

}  // namespace engine
