#include "nn/attention_blocks.h"

#include <cmath>

#include "core/cpu_isa.h"
#include "nn/fast_math.h"
#include "nn/softmax_rows.h"

namespace engine::ops::attention_detail {

namespace {

// The row loops of a block of m queries from t0, whose rows are n floats apart and row i sees keys
// [0, t0 + i]: always inlined into one wrapper per ISA (core/cpu_isa.h), the same bits on each.

// Scores to probabilities in place (zero above the diagonal); inv[i] = 1 / row sum, lse[i] = its log-sum-exp.
template <bool wide>
[[gnu::always_inline]] inline void softmax_block(float* s, int64_t m, int64_t n, int64_t t0, float* inv, float* lse) {
  for (int64_t i = 0; i < m; ++i) {
    float* p = s + i * n;
    const int64_t seen = t0 + i + 1;
    const float top = row_max(p, seen);
    const float sum = wide ? exp_row_sum16(p, seen, top) : exp_row_sum(p, seen, top);
    std::fill(p + seen, p + n, 0.0f);
    inv[i] = 1.0f / sum;
    lse[i] = top + std::log(sum);
  }
}

// Scores to the forward's probabilities, exp(s - lse), from its saved log-sum-exp.
template <bool wide>
[[gnu::always_inline]] inline void probabilities_block(float* s, int64_t m, int64_t n, int64_t t0, const float* lse) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = s + i * n;
    const int64_t seen = t0 + i + 1;
    if constexpr (wide)
      exp_row16(row, seen, lse[i]);
    else
      exp_row(row, seen, lse[i]);
    std::fill(row + seen, row + n, 0.0f);
  }
}

// dP to dS in place: dS = P (dP - delta), delta = sum_s P dP per query (which is dO . out, summed
// here from fp32 P rather than read from the stored, in 16 bits rounded, out).
[[gnu::always_inline]] inline void score_gradient_block(const float* p, float* ds, int64_t m, int64_t n, int64_t t0) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t seen = t0 + i + 1;
    softmax_backward_row(p + i * n, ds + i * n, seen);
    std::fill(ds + i * n + seen, ds + (i + 1) * n, 0.0f);
  }
}

void softmax_block_avx2(float* s, int64_t m, int64_t n, int64_t t0, float* inv, float* lse) {
  softmax_block<false>(s, m, n, t0, inv, lse);
}
void probabilities_block_avx2(float* s, int64_t m, int64_t n, int64_t t0, const float* lse) {
  probabilities_block<false>(s, m, n, t0, lse);
}
void score_gradient_block_avx2(const float* p, float* ds, int64_t m, int64_t n, int64_t t0) {
  score_gradient_block(p, ds, m, n, t0);
}
ENGINE_TARGET_AVX512 void softmax_block_avx512(float* s, int64_t m, int64_t n, int64_t t0, float* inv, float* lse) {
  softmax_block<true>(s, m, n, t0, inv, lse);
}
ENGINE_TARGET_AVX512 void probabilities_block_avx512(float* s, int64_t m, int64_t n, int64_t t0, const float* lse) {
  probabilities_block<true>(s, m, n, t0, lse);
}
ENGINE_TARGET_AVX512 void score_gradient_block_avx512(const float* p, float* ds, int64_t m, int64_t n, int64_t t0) {
  score_gradient_block(p, ds, m, n, t0);
}

}  // namespace

const BlockLoops& block_loops() {
  static const BlockLoops avx2{softmax_block_avx2, probabilities_block_avx2, score_gradient_block_avx2};
  static const BlockLoops avx512{softmax_block_avx512, probabilities_block_avx512, score_gradient_block_avx512};
  return kernel_isa() == CpuIsa::avx512 ? avx512 : avx2;
}

}  // namespace engine::ops::attention_detail
