// The optimizer update kernels (engine/optim/update_kernels.h): each instruction-set path agrees with
// a double-precision evaluation of the same formula, and all paths, thread counts and splits of the
// arrays give the bits of a plain std::fma loop.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "optim/update_kernels.h"
#include "optim/update_kernels_isa.h"

namespace engine {
namespace {

using update_isa::Isa;

// Lengths around the vector widths (8, 16), tiny ones, and ones past the threading threshold.
const int64_t kLengths[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001, 65535, 65536 + 16 + 5, 200003};

std::vector<Isa> paths() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (update_isa::supported(isa)) out.push_back(isa);
  return out;
}

// Optimizer state as after some training: weights O(1), small gradients, v near g^2.
struct State {
  std::vector<float> w, g, m, v;
  State(int64_t n, unsigned seed) : w(n), g(n), m(n), v(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (int64_t k = 0; k < n; ++k) {
      w[k] = normal(rng);
      g[k] = normal(rng) * 1e-2f * std::exp2(float(int(rng() % 9) - 4));
      m[k] = normal(rng) * 1e-2f;
      v[k] = std::abs(normal(rng)) * 1e-4f;
    }
  }
};

AdamWScalars example_adamw(float decay) {
  recipe::OptimizerSection config;
  config.betas = {0.9, 0.95};
  config.eps = 1e-8;
  config.weight_decay = 0.1;
  AdamWScalars s = adamw_scalars(config, 3e-4, 7, decay != 0);
  return s;
}

// The formula of update_kernels.h, element by element.
void adamw_reference_fma(State& st, const AdamWScalars& s) {
  for (size_t k = 0; k < st.w.size(); ++k) {
    st.m[k] = std::fma(s.beta1, st.m[k], s.one_minus_beta1 * st.g[k]);
    st.v[k] = std::fma(s.beta2, st.v[k], (s.one_minus_beta2 * st.g[k]) * st.g[k]);
    st.w[k] = std::fma(-s.decay, st.w[k], st.w[k]);
    const float d = std::fma(std::sqrt(st.v[k]), s.denom_scale, s.eps);
    st.w[k] = std::fma(-s.step_size, st.m[k] / d, st.w[k]);
  }
}

void sgd_reference_fma(std::vector<float>& w, const std::vector<float>& g, std::vector<float>* buf,
                       const SgdScalars& s) {
  for (size_t k = 0; k < w.size(); ++k) {
    float d = std::fma(s.decay, w[k], g[k]);
    if (buf) {
      (*buf)[k] = s.first ? d : std::fma(s.momentum, (*buf)[k], d);
      d = s.nesterov ? std::fma(s.momentum, (*buf)[k], d) : (*buf)[k];
    }
    w[k] = std::fma(-s.lr, d, w[k]);
  }
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0)
      FAIL() << what << ": element " << k << " of " << a.size() << ": " << a[k] << " vs " << b[k];
}

TEST(AdamWScalars, FollowTheBiasCorrectionInDouble) {
  recipe::OptimizerSection config;
  config.betas = {0.9, 0.999};
  config.eps = 1e-8;
  config.weight_decay = 0.1;
  const AdamWScalars s = adamw_scalars(config, 1e-3, 3, true);
  EXPECT_EQ(s.beta1, 0.9f);
  EXPECT_EQ(s.one_minus_beta1, 1.0f - 0.9f);
  EXPECT_EQ(s.one_minus_beta2, 1.0f - 0.999f);
  EXPECT_EQ(s.step_size, float(1e-3 / (1.0 - std::pow(0.9, 3.0))));
  EXPECT_EQ(s.denom_scale, float(1.0 / std::sqrt(1.0 - std::pow(0.999, 3.0))));
  EXPECT_EQ(s.decay, float(1e-3 * 0.1));
  EXPECT_EQ(adamw_scalars(config, 1e-3, 3, false).decay, 0.0f);
}

TEST(AdamWUpdate, EveryPathMatchesADoubleReference) {
  for (Isa isa : paths())
    for (float decay : {0.0f, 1.0f}) {
      const AdamWScalars s = example_adamw(decay);
      const State before(1001, 1);
      State st = before;
      update_isa::adamw(isa, st.w.data(), st.g.data(), st.m.data(), st.v.data(), 1001, s);
      for (int k = 0; k < 1001; ++k) {
        const double g = before.g[k];
        const double m = double(s.beta1) * before.m[k] + double(s.one_minus_beta1) * g;
        const double v = double(s.beta2) * before.v[k] + double(s.one_minus_beta2) * g * g;
        const double step = double(s.step_size) * m / (std::sqrt(v) * s.denom_scale + s.eps);
        const double w = before.w[k] - double(s.decay) * before.w[k] - step;
        const double m_terms = std::abs(double(s.beta1) * before.m[k]) + std::abs(double(s.one_minus_beta1) * g);
        EXPECT_NEAR(st.m[k], m, 2.5e-7 * m_terms) << update_isa::name(isa) << " m[" << k << "]";
        EXPECT_NEAR(st.v[k], v, 4e-7 * std::abs(v)) << update_isa::name(isa) << " v[" << k << "]";
        // The update to a few ulps, and two roundings of w (after the decay, after the update).
        EXPECT_NEAR(st.w[k], w, 1e-6 * std::abs(step) + 1.2e-7 * std::abs(w))
            << update_isa::name(isa) << " w[" << k << "]";
      }
    }
}

TEST(AdamWUpdate, EveryPathGivesTheBitsOfAPlainFmaLoop) {
  for (int64_t n : kLengths)
    for (int64_t offset : {0, 1, 5}) {  // starts off a 64-byte boundary
      const AdamWScalars s = example_adamw(1.0f);
      State expected(n + offset, unsigned(n));
      State initial = expected;
      adamw_reference_fma(expected, s);
      for (Isa isa : paths()) {
        State st = initial;
        update_isa::adamw(isa, st.w.data() + offset, st.g.data() + offset, st.m.data() + offset, st.v.data() + offset,
                          n, s);
        // The elements before the offset stay as they were, as the reference's do not: compare from it.
        for (int64_t k = 0; k < offset; ++k) st.w[k] = expected.w[k], st.m[k] = expected.m[k], st.v[k] = expected.v[k];
        const std::string what = std::string(update_isa::name(isa)) + " n=" + std::to_string(n);
        expect_same_bits(st.w, expected.w, what + " w");
        expect_same_bits(st.m, expected.m, what + " m");
        expect_same_bits(st.v, expected.v, what + " v");
      }
    }
}

TEST(AdamWUpdate, ThreadCountAndChunkingDoNotChangeTheBits) {
  const int64_t n = 300007;
  const AdamWScalars s = example_adamw(1.0f);
  const State initial(n, 9);
  const int threads = omp_get_max_threads();
  std::vector<State> results;
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    State st = initial;
    adamw_update(st.w.data(), st.g.data(), st.m.data(), st.v.data(), n, s);
    results.push_back(st);
  }
  omp_set_num_threads(threads);
  // In chunks, as an optimizer streaming its state would call it.
  State chunked = initial;
  for (int64_t b = 0; b < n; b += 70001) {
    const int64_t e = std::min(n, b + 70001);
    adamw_update(chunked.w.data() + b, chunked.g.data() + b, chunked.m.data() + b, chunked.v.data() + b, e - b, s);
  }
  results.push_back(chunked);
  for (size_t r = 1; r < results.size(); ++r) {
    expect_same_bits(results[r].w, results[0].w, "w");
    expect_same_bits(results[r].m, results[0].m, "m");
    expect_same_bits(results[r].v, results[0].v, "v");
  }
}

struct SgdCase {
  bool momentum, nesterov, first;
  float decay;
};

TEST(SgdUpdate, EveryVariantAndPathGivesTheBitsOfAPlainFmaLoop) {
  for (SgdCase c :
       {SgdCase{false, false, true, 0.0f}, SgdCase{false, false, false, 0.01f}, SgdCase{true, false, true, 0.01f},
        SgdCase{true, false, false, 0.01f}, SgdCase{true, true, true, 0.0f}, SgdCase{true, true, false, 0.01f}})
    for (int64_t n : kLengths) {
      const SgdScalars s{.lr = 0.05f, .decay = c.decay, .momentum = 0.9f, .nesterov = c.nesterov, .first = c.first};
      const State initial(n, unsigned(n) + 3);  // w, g, and m as the momentum buffer
      std::vector<float> w = initial.w, buf = initial.m;
      sgd_reference_fma(w, initial.g, c.momentum ? &buf : nullptr, s);
      for (Isa isa : paths())
        for (int t : {1, 2}) {
          const int threads = omp_get_max_threads();
          omp_set_num_threads(t);
          std::vector<float> w_isa = initial.w, buf_isa = initial.m;
          update_isa::sgd(isa, w_isa.data(), initial.g.data(), c.momentum ? buf_isa.data() : nullptr, n, s);
          omp_set_num_threads(threads);
          const std::string what = std::string(update_isa::name(isa)) + " n=" + std::to_string(n) +
                                   " momentum=" + std::to_string(c.momentum) +
                                   " nesterov=" + std::to_string(c.nesterov) + " first=" + std::to_string(c.first);
          expect_same_bits(w_isa, w, what + " w");
          expect_same_bits(buf_isa, buf, what + " buffer");
        }
    }
}

TEST(SgdUpdate, MatchesADoubleReference) {
  const int64_t n = 1001;
  const State initial(n, 5);
  for (Isa isa : paths())
    for (bool nesterov : {false, true}) {
      const SgdScalars s{.lr = 0.05f, .decay = 0.01f, .momentum = 0.9f, .nesterov = nesterov, .first = false};
      std::vector<float> w = initial.w, buf = initial.m;
      update_isa::sgd(isa, w.data(), initial.g.data(), buf.data(), n, s);
      for (int64_t k = 0; k < n; ++k) {
        const double d = initial.g[k] + double(s.decay) * initial.w[k];
        const double b = double(s.momentum) * initial.m[k] + d;
        const double step = double(s.lr) * (nesterov ? d + double(s.momentum) * b : b);
        EXPECT_NEAR(buf[k], b, 1e-6 * (std::abs(d) + std::abs(b)));
        EXPECT_NEAR(w[k], initial.w[k] - step, 1e-6 * std::abs(step) + 6e-8 * std::abs(initial.w[k]));
      }
    }
}

TEST(UpdateKernels, TheBestPathIsTheWidestThisCpuRuns) {
  const Isa best = update_isa::best();
  EXPECT_TRUE(update_isa::supported(best));
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(best, Isa::avx512);
  }
  EXPECT_TRUE(update_isa::supported(Isa::scalar));
}

}  // namespace
}  // namespace engine
