#include "core/convert.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/cpu_isa.h"

namespace engine {

namespace {

// The same arithmetic as float_to_bf16: round to nearest even, NaN kept a (quiet) NaN.
inline uint16_t round_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#ifdef __AVX2__
// round_to_bf16 on eight floats, each result in the low half of its 32-bit lane. (AVX512-BF16's
// vcvtneps2bf16 would be one instruction, but it flushes subnormals to zero, so it is not used.)
inline __m256i round_to_bf16(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}
#endif

#if ENGINE_HAS_AVX512_KERNELS
// The bf16 loops as plain scalar code, which the AVX-512 wrappers below vectorise 16 floats at a
// time: the same arithmetic as round_to_bf16, so the same bits as the AVX2 loops.
ENGINE_TARGET_AVX512 void widen_bf16_avx512(const uint16_t* s, float* dst, int64_t n, bool accumulate) {
  if (accumulate) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] += std::bit_cast<float>(uint32_t(s[i]) << 16);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(s[i]) << 16);
  }
}

ENGINE_TARGET_AVX512 void narrow_bf16_avx512(const float* src, uint16_t* d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x0040u;
    d[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
#endif

// Splits [0, n) into blocks across the threads when n is large, else runs `f` once on the caller.
template <class F>
void blocks(int64_t n, F f) {
  constexpr int64_t kBlock = 16384;
  if (n <= kSerialElements) return f(int64_t(0), n);
#pragma omp parallel for schedule(static)
  for (int64_t begin = 0; begin < n; begin += kBlock) f(begin, std::min(kBlock, n - begin));
}

}  // namespace

void widen_serial(const void* src, DType type, float* dst, int64_t n, bool accumulate) {
  switch (type) {
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
#if ENGINE_HAS_AVX512_KERNELS
      if (kernel_isa() == CpuIsa::avx512) return widen_bf16_avx512(s, dst, n, accumulate);
#endif
      int64_t i = 0;
#ifdef __AVX2__
      for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
        if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(dst + i));
        _mm256_storeu_ps(dst + i, v);
      }
#endif
      for (; i < n; ++i) {
        const float v = std::bit_cast<float>(uint32_t(s[i]) << 16);
        dst[i] = accumulate ? dst[i] + v : v;
      }
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(dst + i));
        _mm256_storeu_ps(dst + i, v);
      }
#endif
      for (; i < n; ++i) dst[i] = (accumulate ? dst[i] : 0.0f) + f16_to_float(s[i]);
      return;
    }
    default: {
      const auto* s = static_cast<const float*>(src);
      if (!accumulate) {
        std::memmove(dst, s, size_t(n) * 4);
        return;
      }
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] += s[i];
      return;
    }
  }
}

void narrow_serial(const float* src, void* dst, DType type, int64_t n) {
  switch (type) {
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
#if ENGINE_HAS_AVX512_KERNELS
      if (kernel_isa() == CpuIsa::avx512) return narrow_bf16_avx512(src, d, n);
#endif
      int64_t i = 0;
#ifdef __AVX2__
      for (; i + 16 <= n; i += 16) {
        // Both halves' results fit 16 bits, so the saturating pack keeps them; it interleaves the
        // 128-bit lanes, which the permute puts back in order.
        const __m256i packed =
            _mm256_packus_epi32(round_to_bf16(_mm256_loadu_ps(src + i)), round_to_bf16(_mm256_loadu_ps(src + i + 8)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_permute4x64_epi64(packed, 0xd8));
      }
#endif
      for (; i < n; ++i) d[i] = round_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
      }
#endif
      for (; i < n; ++i) d[i] = float_to_f16(src[i]);
      return;
    }
    default:
      std::memmove(dst, src, size_t(n) * 4);
      return;
  }
}

void widen(const void* src, DType type, float* dst, int64_t n, bool accumulate) {
  const auto* bytes = static_cast<const std::byte*>(src);
  const int64_t size = int64_t(dtype_size(type));
  blocks(n, [&](int64_t begin, int64_t count) {
    widen_serial(bytes + begin * size, type, dst + begin, count, accumulate);
  });
}

void narrow(const float* src, void* dst, DType type, int64_t n) {
  auto* bytes = static_cast<std::byte*>(dst);
  const int64_t size = int64_t(dtype_size(type));
  blocks(n, [&](int64_t begin, int64_t count) { narrow_serial(src + begin, bytes + begin * size, type, count); });
}

}  // namespace engine
