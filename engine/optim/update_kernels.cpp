#include "optim/update_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "optim/update_kernels_isa.h"
#include "optim/update_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ENGINE_UPDATE_X86 1
#endif

// This file is built with -ffp-contract=off (engine/CMakeLists.txt): the only fused multiply-adds
// are the written ones, so the scalar loop (optim/update_math.h's element functions, which the CUDA
// kernels run too) rounds exactly as the vector paths do.

namespace engine {

AdamWScalars adamw_scalars(const recipe::OptimizerSection& config, double lr, int64_t t, bool decay) {
  const double beta1 = config.betas[0], beta2 = config.betas[1];
  const auto b1 = float(beta1), b2 = float(beta2);
  return {.beta1 = b1,
          .beta2 = b2,
          .one_minus_beta1 = 1.0f - b1,
          .one_minus_beta2 = 1.0f - b2,
          .eps = float(config.eps),
          .step_size = float(lr / (1.0 - std::pow(beta1, double(t)))),
          .denom_scale = float(1.0 / std::sqrt(1.0 - std::pow(beta2, double(t)))),
          .decay = decay ? float(lr * config.weight_decay) : 0.0f};
}

namespace {

using update_isa::Isa;

void adamw_scalar(float* __restrict w, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                  const AdamWScalars& s) {
  for (int64_t k = 0; k < n; ++k) adamw_element(w[k], g[k], m[k], v[k], s);
}

void sgd_scalar(float* __restrict w, const float* __restrict g, float* __restrict buf, int64_t n, const SgdScalars& s) {
  for (int64_t k = 0; k < n; ++k) sgd_element(w[k], g[k], buf ? buf + k : nullptr, s);
}

#ifdef ENGINE_UPDATE_X86

// Elements before the first 64-byte-aligned one of w: the vector loop then never splits a cache line
// (the optimizer's arrays share one offset from aligned bases, so aligning w aligns them all).
int64_t unaligned_head(const float* w, int64_t n) {
  return std::min(n, int64_t((64 - (reinterpret_cast<uintptr_t>(w) & 63)) & 63) / 4);
}

__attribute__((target("avx512f"))) void adamw_avx512(float* w, const float* g, float* m, float* v, int64_t n,
                                                     const AdamWScalars& s) {
  const int64_t head = unaligned_head(w, n);
  adamw_scalar(w, g, m, v, head, s);
  const __m512 beta1 = _mm512_set1_ps(s.beta1), beta2 = _mm512_set1_ps(s.beta2);
  const __m512 omb1 = _mm512_set1_ps(s.one_minus_beta1), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(s.eps), scale = _mm512_set1_ps(s.denom_scale);
  const __m512 neg_step = _mm512_set1_ps(-s.step_size), neg_decay = _mm512_set1_ps(-s.decay);
  int64_t k = head;
  for (; k + 16 <= n; k += 16) {
    const __m512 gk = _mm512_loadu_ps(g + k);
    const __m512 mk = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + k), _mm512_mul_ps(omb1, gk));
    const __m512 vk = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + k), _mm512_mul_ps(_mm512_mul_ps(omb2, gk), gk));
    __m512 wk = _mm512_loadu_ps(w + k);
    wk = _mm512_fmadd_ps(neg_decay, wk, wk);
    // maskz with every lane set is the plain square root; GCC 12's _mm512_sqrt_ps trips its own
    // -Wmaybe-uninitialized.
    const __m512 d = _mm512_fmadd_ps(_mm512_maskz_sqrt_ps(__mmask16(0xffff), vk), scale, eps);
    _mm512_storeu_ps(w + k, _mm512_fmadd_ps(neg_step, _mm512_div_ps(mk, d), wk));
    _mm512_storeu_ps(m + k, mk);
    _mm512_storeu_ps(v + k, vk);
  }
  adamw_scalar(w + k, g + k, m + k, v + k, n - k, s);
}

__attribute__((target("avx2,fma"))) void adamw_avx2(float* w, const float* g, float* m, float* v, int64_t n,
                                                    const AdamWScalars& s) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1), beta2 = _mm256_set1_ps(s.beta2);
  const __m256 omb1 = _mm256_set1_ps(s.one_minus_beta1), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.eps), scale = _mm256_set1_ps(s.denom_scale);
  const __m256 neg_step = _mm256_set1_ps(-s.step_size), neg_decay = _mm256_set1_ps(-s.decay);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 gk = _mm256_loadu_ps(g + k);
    const __m256 mk = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(m + k), _mm256_mul_ps(omb1, gk));
    const __m256 vk = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(v + k), _mm256_mul_ps(_mm256_mul_ps(omb2, gk), gk));
    __m256 wk = _mm256_loadu_ps(w + k);
    wk = _mm256_fmadd_ps(neg_decay, wk, wk);
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(vk), scale, eps);
    _mm256_storeu_ps(w + k, _mm256_fmadd_ps(neg_step, _mm256_div_ps(mk, d), wk));
    _mm256_storeu_ps(m + k, mk);
    _mm256_storeu_ps(v + k, vk);
  }
  adamw_scalar(w + k, g + k, m + k, v + k, n - k, s);
}

// The SGD variants differ in branches that are the same for every element (predicted once).
__attribute__((target("avx512f"))) void sgd_avx512(float* w, const float* g, float* buf, int64_t n,
                                                   const SgdScalars& s) {
  const int64_t head = unaligned_head(w, n);
  sgd_scalar(w, g, buf, head, s);
  const __m512 decay = _mm512_set1_ps(s.decay), mu = _mm512_set1_ps(s.momentum), neg_lr = _mm512_set1_ps(-s.lr);
  int64_t k = head;
  for (; k + 16 <= n; k += 16) {
    const __m512 wk = _mm512_loadu_ps(w + k);
    __m512 d = _mm512_fmadd_ps(decay, wk, _mm512_loadu_ps(g + k));
    if (buf) {
      const __m512 b = s.first ? d : _mm512_fmadd_ps(mu, _mm512_loadu_ps(buf + k), d);
      _mm512_storeu_ps(buf + k, b);
      d = s.nesterov ? _mm512_fmadd_ps(mu, b, d) : b;
    }
    _mm512_storeu_ps(w + k, _mm512_fmadd_ps(neg_lr, d, wk));
  }
  sgd_scalar(w + k, g + k, buf ? buf + k : nullptr, n - k, s);
}

__attribute__((target("avx2,fma"))) void sgd_avx2(float* w, const float* g, float* buf, int64_t n,
                                                  const SgdScalars& s) {
  const __m256 decay = _mm256_set1_ps(s.decay), mu = _mm256_set1_ps(s.momentum), neg_lr = _mm256_set1_ps(-s.lr);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 wk = _mm256_loadu_ps(w + k);
    __m256 d = _mm256_fmadd_ps(decay, wk, _mm256_loadu_ps(g + k));
    if (buf) {
      const __m256 b = s.first ? d : _mm256_fmadd_ps(mu, _mm256_loadu_ps(buf + k), d);
      _mm256_storeu_ps(buf + k, b);
      d = s.nesterov ? _mm256_fmadd_ps(mu, b, d) : b;
    }
    _mm256_storeu_ps(w + k, _mm256_fmadd_ps(neg_lr, d, wk));
  }
  sgd_scalar(w + k, g + k, buf ? buf + k : nullptr, n - k, s);
}

#endif

// Threads take contiguous runs of blocks: each block's four arrays (4 x 64 KiB) stay in L2 while it
// is updated, and a thread streams through its part of the array in order. Below kParallelMin
// elements one thread is faster than waking the others (a few microseconds). Every element's
// update depends on that element alone, so the split never changes a bit.
constexpr int64_t kBlock = 16384;
constexpr int64_t kParallelMin = int64_t(1) << 16;

template <class Update>
void in_blocks(int64_t n, const Update& update) {
  if (n < kParallelMin || omp_get_max_threads() == 1 || omp_in_parallel()) return update(0, n);
  const int64_t count = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < count; ++b) update(b * kBlock, std::min(n, (b + 1) * kBlock));
}

}  // namespace

namespace update_isa {

const char* name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    case Isa::scalar:
      break;
  }
  return "scalar";
}

bool supported(Isa isa) {
#ifdef ENGINE_UPDATE_X86
  if (isa == Isa::avx512) return __builtin_cpu_supports("avx512f");
  if (isa == Isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == Isa::scalar;
}

Isa best() {
  static const Isa isa = supported(Isa::avx512) ? Isa::avx512 : supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return isa;
}

void adamw(Isa isa, float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  ENGINE_CHECK(supported(isa), std::string("the optimizer update's ") + name(isa) + " path does not run on this CPU");
  auto kernel = adamw_scalar;
#ifdef ENGINE_UPDATE_X86
  if (isa == Isa::avx512) kernel = adamw_avx512;
  if (isa == Isa::avx2) kernel = adamw_avx2;
#endif
  in_blocks(n, [&](int64_t b, int64_t e) { kernel(w + b, g + b, m + b, v + b, e - b, s); });
}

void sgd(Isa isa, float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s) {
  ENGINE_CHECK(supported(isa), std::string("the optimizer update's ") + name(isa) + " path does not run on this CPU");
  auto kernel = sgd_scalar;
#ifdef ENGINE_UPDATE_X86
  if (isa == Isa::avx512) kernel = sgd_avx512;
  if (isa == Isa::avx2) kernel = sgd_avx2;
#endif
  in_blocks(n, [&](int64_t b, int64_t e) {
    kernel(w + b, g + b, momentum_buffer ? momentum_buffer + b : nullptr, e - b, s);
  });
}

}  // namespace update_isa

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  update_isa::adamw(update_isa::best(), w, g, m, v, n, s);
}

void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s) {
  update_isa::sgd(update_isa::best(), w, g, momentum_buffer, n, s);
}

}  // namespace engine
