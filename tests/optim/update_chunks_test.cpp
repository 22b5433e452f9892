// The multi-tensor update's table and block program (engine/optim/update_chunks.h) and the step's
// decision (update_math.h decide_update), on the CPU: the CUDA kernel runs the same program over
// the same table with 16-byte accesses in place of this test's element-by-element ones, so what
// holds here for the indexing and the arithmetic holds there (tests/optim/device_update_check.cu
// checks the kernels themselves on a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "optim/optimizer.h"
#include "optim/update_chunks.h"
#include "optim/update_kernels.h"
#include "optim/update_math.h"

namespace engine {
namespace {

// Two units' optimizer state; the gradients in fp32 and, apart, rounded to bf16.
struct TwoUnitState {
  std::vector<std::vector<float>> w, g, m, v;
  std::vector<std::vector<uint16_t>> copy, g16;
  TwoUnitState(const std::vector<int64_t>& sizes, std::mt19937& rng) {
    std::normal_distribution<float> normal;
    for (int64_t n : sizes) {
      auto fill = [&](float scale, bool positive = false) {
        std::vector<float> x(size_t(n) + 16);
        for (float& e : x) e = positive ? std::abs(normal(rng)) * scale : normal(rng) * scale;
        return x;
      };
      w.push_back(fill(1));
      g.push_back(fill(1e-2f));
      g16.emplace_back(g.back().size());
      for (size_t i = 0; i < g.back().size(); ++i) g16.back()[i] = float_to_bf16(g.back()[i]);
      m.push_back(fill(1e-2f));
      v.push_back(fill(1e-4f, true));
      copy.emplace_back(size_t(n) + 16);
    }
  }
  // g `g_shift` elements from its start, in fp32 or bf16.
  std::vector<UpdateArrays> arrays(int g_shift, DType grad = DType::f32) {
    std::vector<UpdateArrays> out;
    for (size_t u = 0; u < w.size(); ++u) {
      const void* gradients =
          grad == DType::f32 ? static_cast<const void*>(g[u].data() + g_shift) : g16[u].data() + g_shift;
      out.push_back({w[u].data(), gradients, m[u].data(), v[u].data(), reinterpret_cast<std::byte*>(copy[u].data())});
    }
    return out;
  }
};

const std::vector<Segment> kSegments = {
    {0, 0, 5, false}, {0, 5, 70001, true}, {0, 70001, 70004, false}, {1, 0, 100003, true}, {1, 100003, 100008, false}};

TEST(UpdateChunks, EverySegmentsElementsAreOneChunksWithTheSegmentsDecay) {
  std::mt19937 rng(3);
  TwoUnitState state({70004, 100008}, rng);
  for (const auto& [g_shift, grad] :
       {std::pair{0, DType::f32}, std::pair{1, DType::f32}, std::pair{0, DType::bf16}, std::pair{1, DType::bf16}}) {
    const std::vector<UpdateArrays> arrays = state.arrays(g_shift, grad);
    const int64_t grad_size = int64_t(dtype_size(grad));
    const std::vector<UpdateChunk> table = plan_update_chunks(kSegments, arrays, 2, grad_size);
    std::vector<std::vector<int>> seen{std::vector<int>(70004), std::vector<int>(100008)};
    int64_t packs = 0;
    for (const UpdateChunk& c : table) {
      ASSERT_GT(c.n, 0);
      ASSERT_LE(c.n, kUpdateChunk);
      ASSERT_LE(c.head + 4 * c.packs, c.n);
      const size_t unit = c.w >= state.w[1].data() && c.w < state.w[1].data() + state.w[1].size() ? 1 : 0;
      const int64_t begin = c.w - arrays[unit].w;
      EXPECT_EQ(c.g, static_cast<const std::byte*>(arrays[unit].g) + begin * grad_size);
      EXPECT_EQ(c.m, arrays[unit].m + begin);
      EXPECT_EQ(c.v, arrays[unit].v + begin);
      EXPECT_EQ(c.copy, arrays[unit].copy + begin * 2);
      for (const Segment& s : kSegments)
        if (s.unit == unit && begin >= s.begin && begin < s.end) {
          EXPECT_EQ(c.decay, s.decay ? 1 : 0);
          EXPECT_LE(begin + c.n, s.end) << "a chunk crosses a segment's end";
        }
      for (int64_t i = 0; i < c.n; ++i) seen[unit][size_t(begin + i)] += 1;
      if (c.packs > 0) {
        const float* at = c.w + c.head;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % 16, 0u);
        EXPECT_EQ(
            reinterpret_cast<uintptr_t>(static_cast<const std::byte*>(c.g) + c.head * grad_size) % (4 * grad_size), 0u);
        EXPECT_EQ(c.copy_packs, reinterpret_cast<uintptr_t>(static_cast<std::byte*>(c.copy) + c.head * 2) % 8 == 0);
      }
      packs += c.packs;
    }
    for (const auto& unit : seen)
      for (int count : unit) ASSERT_EQ(count, 1);
    if (g_shift == 0)
      EXPECT_GT(packs, 40000) << "aligned arrays take packs";
    else
      EXPECT_EQ(packs, 0) << "gradients whose packs are not aligned to their size cannot";
  }
}

// The block program's memory policy on the CPU: element by element, the gradients in fp32 or bf16,
// the copies in bf16 (rounded as the device's from_float).
struct HostUpdateMemory {
  DType grad = DType::f32;
  void load4(const float* p, float (&out)[4]) const {
    for (int j = 0; j < 4; ++j) out[j] = p[j];
  }
  void store4(float* p, const float (&in)[4]) const {
    for (int j = 0; j < 4; ++j) p[j] = in[j];
  }
  float gradient(const void* g, int64_t i) const {
    return grad == DType::f32 ? static_cast<const float*>(g)[i] : bf16_to_float(static_cast<const uint16_t*>(g)[i]);
  }
  void gradients4(const void* g, int64_t at, float (&out)[4]) const {
    for (int j = 0; j < 4; ++j) out[j] = gradient(g, at + j);
  }
  void copy(void* copy, int64_t i, float w) const { static_cast<uint16_t*>(copy)[i] = float_to_bf16(w); }
  void copies4(void* copy, int64_t at, const float (&w)[4], bool /*packed*/) const {
    for (int j = 0; j < 4; ++j) this->copy(copy, at + j, w[j]);
  }
};

// The table as the kernel runs it: every thread of a 256-thread block per chunk, through the
// program's packs, heads and tails (an element updated twice, or not at all, shows in the bits).
template <bool kAdamW>
void run_table(const std::vector<UpdateChunk>& table, const MultiTensorScalars& s, DType grad = DType::f32) {
  for (const UpdateChunk& c : table)
    for (int64_t thread = 0; thread < 256; ++thread) update_chunk<kAdamW>(c, thread, 256, s, HostUpdateMemory{grad});
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The CPU step as Session and Optimizer::step take it: the gradients widened to fp32 (bf16 ones
// exactly), scale_gradients' product (where the factor is not 1), the update per segment, the bf16
// copies rounded from the masters. The table reads bf16 gradients where they are.
TEST(UpdateChunks, TheTableGivesTheCpuOptimizersBits) {
  recipe::OptimizerSection adamw_config;
  adamw_config.type = recipe::OptimizerType::adamw;
  adamw_config.betas = {0.9, 0.95};
  adamw_config.eps = 1e-8;
  adamw_config.weight_decay = 0.1;
  for (const double factor : {1.0, 0.37, 1.0 / 1024}) {
    for (const auto& [adamw, grad] : {std::pair{true, DType::f32}, std::pair{true, DType::bf16},
                                      std::pair{false, DType::f32}, std::pair{false, DType::bf16}}) {
      for (const bool momentum : {false, true}) {
        if (adamw && !momentum) continue;
        std::mt19937 rng(7);
        TwoUnitState mine({70004, 100008}, rng);
        TwoUnitState cpu = mine;
        MultiTensorScalars s{};
        s.adamw[1] = adamw_scalars(adamw_config, 3e-4, 5, true);
        s.adamw[0] = adamw_scalars(adamw_config, 3e-4, 5, false);
        s.sgd[0] = SgdScalars{
            .lr = 0.05f, .decay = 0.0f, .momentum = momentum ? 0.9f : 0.0f, .nesterov = true, .first = false};
        s.sgd[1] = s.sgd[0];
        s.sgd[1].decay = 0.01f;
        s.decision.factor = factor;
        std::vector<UpdateArrays> arrays = mine.arrays(0, grad);
        for (UpdateArrays& a : arrays) {
          if (!adamw) a.v = nullptr;
          if (!adamw && !momentum) a.m = nullptr;
        }
        const std::vector<UpdateChunk> table = plan_update_chunks(kSegments, arrays, 2, int64_t(dtype_size(grad)));
        if (adamw)
          run_table<true>(table, s, grad);
        else
          run_table<false>(table, s, grad);
        for (size_t u = 0; u < cpu.w.size(); ++u) {
          if (grad == DType::bf16)  // the CPU's fp32 gradients: the bf16 sums widened
            for (size_t i = 0; i < cpu.g[u].size(); ++i) cpu.g[u][i] = bf16_to_float(cpu.g16[u][i]);
          if (factor != 1.0)
            for (float& x : cpu.g[u]) x *= float(factor);
        }
        for (const Segment& seg : kSegments) {
          float* w = cpu.w[seg.unit].data() + seg.begin;
          const float* g = cpu.g[seg.unit].data() + seg.begin;
          const int64_t n = seg.end - seg.begin;
          if (adamw)
            adamw_update(w, g, cpu.m[seg.unit].data() + seg.begin, cpu.v[seg.unit].data() + seg.begin, n,
                         s.adamw[seg.decay ? 1 : 0]);
          else
            sgd_update(w, g, momentum ? cpu.m[seg.unit].data() + seg.begin : nullptr, n, s.sgd[seg.decay ? 1 : 0]);
        }
        for (size_t u = 0; u < cpu.w.size(); ++u) {
          const size_t n = size_t(kSegments[u == 0 ? 2 : 4].end);
          cpu.w[u].resize(n);
          mine.w[u].resize(n);
          cpu.m[u].resize(n);
          mine.m[u].resize(n);
          cpu.v[u].resize(n);
          mine.v[u].resize(n);
          std::vector<uint16_t> copy(n);
          for (size_t i = 0; i < n; ++i) copy[i] = float_to_bf16(cpu.w[u][i]);
          mine.copy[u].resize(n);
          EXPECT_TRUE(same_bits(cpu.w[u], mine.w[u])) << "weights, factor " << factor << " adamw " << adamw;
          EXPECT_TRUE(same_bits(cpu.m[u], mine.m[u])) << "first moment or momentum, factor " << factor;
          EXPECT_TRUE(same_bits(cpu.v[u], mine.v[u])) << "second moment, factor " << factor;
          EXPECT_TRUE(same_bits(copy, mine.copy[u])) << "bf16 copies, factor " << factor;
        }
      }
    }
  }
}

TEST(UpdateChunks, ASkippedDecisionLeavesEveryArrayAsItWas) {
  std::mt19937 rng(9);
  TwoUnitState mine({70004, 100008}, rng);
  const TwoUnitState before = mine;
  MultiTensorScalars s{};
  s.decision.skip = 1;
  run_table<true>(plan_update_chunks(kSegments, mine.arrays(0), 2), s);
  EXPECT_TRUE(same_bits(before.w[0], mine.w[0]) && same_bits(before.v[1], mine.v[1]));
}

// decide_update is what the host's step did before it existed: overflow skips only with the fp16
// scaler, the norm is unscaled, clipping's factor is over the unscaled norm, divided by the scale.
TEST(UpdateDecision, SkipsOverflowWithTheScalerAndClipsTheUnscaledNorm) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double scaled_norm, scale, max_norm;
    bool scaler;
  };
  for (const Case& c : {Case{3.0, 1.0, 1.0, false}, Case{0.5, 1.0, 1.0, false}, Case{4096.0, 1024.0, 1.0, true},
                        Case{4096.0, 1024.0, 0.0, true}, Case{inf, 1024.0, 1.0, true}, Case{nan, 1024.0, 1.0, true},
                        Case{nan, 1.0, 1.0, false}, Case{inf, 1.0, 1.0, false}}) {
    const UpdateDecision d = decide_update(
        c.scaled_norm, StepPolicy{.loss_scale = c.scale, .max_norm = c.max_norm, .skip_non_finite = c.scaler});
    const bool overflow = c.scaler && !std::isfinite(c.scaled_norm);
    EXPECT_EQ(d.skip != 0, overflow) << c.scaled_norm;
    if (overflow) continue;
    const double norm = c.scaled_norm / c.scale;
    EXPECT_EQ(std::memcmp(&d.grad_norm, &norm, 8) == 0 || (std::isnan(norm) && std::isnan(d.grad_norm)), true);
    const double factor = (c.max_norm > 0 && norm > c.max_norm ? c.max_norm / (norm + 1e-6) : 1.0) / c.scale;
    EXPECT_EQ(d.factor, factor) << c.scaled_norm << " " << c.scale;
  }
}

// The norm adds its partials in chunks of kNormChunk and the chunks' sums in order (what a GPU
// can add in parallel), and stays within rounding of the exact sum.
TEST(UpdateDecision, TheNormAddsItsPartialsChunkByChunk) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const size_t n : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(257), size_t(121000)}) {
    std::vector<double> partials(n);
    for (double& p : partials) p = std::exp2(40.0 * uniform(rng) - 20.0);
    double chunked = 0;
    for (size_t c = 0; c * 256 < n; ++c) {
      double chunk = 0;
      for (size_t k = c * 256; k < std::min(n, (c + 1) * 256); ++k) chunk += partials[k];
      chunked += chunk;
    }
    EXPECT_EQ(sum_norm_partials(partials), std::sqrt(chunked)) << n;
    long double exact = 0;
    for (double p : partials) exact += p;
    EXPECT_NEAR(sum_norm_partials(partials), std::sqrt(double(exact)), 1e-12 * std::sqrt(double(exact)) + 1e-300);
  }
}

}  // namespace
}  // namespace engine
