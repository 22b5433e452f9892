// The optimizer step's shared element math (engine/optim/update_math.h), which the CUDA kernels
// (optim/update_kernels.cu) run: a loop of the shared functions gives the bits of every
// instruction-set path of the CPU kernels, and block_squares adds in the order the norm partials
// always have (16 interleaved lanes, fixed tree), which the CUDA kernel's half-warp shuffles repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim/update_kernels.h"
#include "optim/update_kernels_isa.h"
#include "optim/update_math.h"

namespace engine {
namespace {

using update_isa::Isa;

const int64_t kMathLengths[] = {1, 7, 16, 33, 1001, 65536 + 16 + 5};

std::vector<Isa> math_paths() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (update_isa::supported(isa)) out.push_back(isa);
  return out;
}

// Values over many binades, with zeros, subnormals and negative zeros sprinkled in.
std::vector<float> random_floats(int64_t n, std::mt19937& rng, float scale, bool non_negative = false) {
  std::normal_distribution<float> normal;
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) {
    switch (rng() % 64) {
      case 0:
        x = 0.0f;
        break;
      case 1:
        x = -0.0f;
        break;
      case 2:
        x = std::numeric_limits<float>::denorm_min() * float(1 + rng() % 1000);
        break;
      default:
        x = normal(rng) * scale * std::exp2(float(int(rng() % 17) - 8));
    }
    if (non_negative) x = std::abs(x);
  }
  return out;
}

void expect_same_math_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0)
      FAIL() << what << ": element " << k << " of " << a.size() << ": " << a[k] << " vs " << b[k];
}

AdamWScalars example_adamw(bool decay, int64_t t) {
  recipe::OptimizerSection config;
  config.betas = {0.9, 0.95};
  config.eps = 1e-8;
  config.weight_decay = 0.1;
  return adamw_scalars(config, 3e-4, t, decay);
}

TEST(UpdateMath, AdamWElementGivesEveryPathsBits) {
  for (int64_t n : kMathLengths)
    for (bool decay : {false, true})
      for (int64_t t : {1, 7, 1000}) {
        const AdamWScalars s = example_adamw(decay, t);
        std::mt19937 rng(unsigned(n * 31 + t));
        const std::vector<float> w0 = random_floats(n, rng, 1.0f), g = random_floats(n, rng, 1e-2f),
                                 m0 = random_floats(n, rng, 1e-2f), v0 = random_floats(n, rng, 1e-4f, true);
        std::vector<float> w = w0, m = m0, v = v0;
        for (size_t k = 0; k < size_t(n); ++k) adamw_element(w[k], g[k], m[k], v[k], s);
        for (Isa isa : math_paths()) {
          std::vector<float> wi = w0, mi = m0, vi = v0;
          update_isa::adamw(isa, wi.data(), g.data(), mi.data(), vi.data(), n, s);
          const std::string what = std::string(update_isa::name(isa)) + " n=" + std::to_string(n) +
                                   " t=" + std::to_string(t) + (decay ? " decay" : "");
          expect_same_math_bits(w, wi, what + " w");
          expect_same_math_bits(m, mi, what + " m");
          expect_same_math_bits(v, vi, what + " v");
        }
      }
}

TEST(UpdateMath, SgdElementGivesEveryPathsBits) {
  for (int64_t n : kMathLengths)
    for (bool momentum : {false, true})
      for (bool nesterov : {false, true})
        for (bool first : {false, true})
          for (float decay : {0.0f, 0.01f}) {
            const SgdScalars s{.lr = 0.05f, .decay = decay, .momentum = 0.9f, .nesterov = nesterov, .first = first};
            std::mt19937 rng(unsigned(n * 7 + nesterov * 2 + first));
            const std::vector<float> w0 = random_floats(n, rng, 1.0f), g = random_floats(n, rng, 1e-2f),
                                     b0 = random_floats(n, rng, 1e-2f);
            std::vector<float> w = w0, b = b0;
            for (size_t k = 0; k < size_t(n); ++k) sgd_element(w[k], g[k], momentum ? &b[k] : nullptr, s);
            for (Isa isa : math_paths()) {
              std::vector<float> wi = w0, bi = b0;
              update_isa::sgd(isa, wi.data(), g.data(), momentum ? bi.data() : nullptr, n, s);
              const std::string what = std::string(update_isa::name(isa)) + " n=" + std::to_string(n) +
                                       (momentum ? " momentum" : "") + (nesterov ? " nesterov" : "") +
                                       (first ? " first" : "") + (decay != 0 ? " decay" : "");
              expect_same_math_bits(w, wi, what + " w");
              expect_same_math_bits(b, bi, what + " buffer");
            }
          }
}

// The order the gradient norm's partials have always been summed in (optimizer.cpp before the math
// moved to update_math.h), written out plainly.
double lanes_then_tree(const float* x) {
  double lanes[16] = {};
  for (int64_t k = 0; k < kShardBlock; k += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += double(x[k + j]) * double(x[k + j]);
  for (int width = 8; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

// The CUDA kernel's order: 16 threads each run one lane with add_square, then four
// __shfl_down_sync(v, width, 16) steps, where a thread whose source is past the half-warp keeps its
// own value; thread 0's sum is the partial.
double half_warp_order(const float* x) {
  double thread[16];
  for (int j = 0; j < 16; ++j) {
    double sum = 0;
    for (int64_t k = 0; k < kShardBlock / 16; ++k) sum = add_square(sum, x[k * 16 + j]);
    thread[j] = sum;
  }
  for (int width = 8; width > 0; width /= 2) {
    double shuffled[16];
    for (int j = 0; j < 16; ++j) shuffled[j] = j + width < 16 ? thread[j + width] : thread[j];
    for (int j = 0; j < 16; ++j) thread[j] = thread[j] + shuffled[j];
  }
  return thread[0];
}

TEST(UpdateMath, BlockSquaresKeepsTheLaneOrder) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    // Magnitudes over many binades, so a change of order changes the rounding.
    const std::vector<float> x = random_floats(kShardBlock, rng, trial % 2 ? 1e3f : 1e-3f);
    const double expected = lanes_then_tree(x.data());
    const double got = block_squares(x.data()), device = half_warp_order(x.data());
    EXPECT_EQ(std::memcmp(&got, &expected, sizeof(double)), 0)
        << "trial " << trial << ": " << got << " vs " << expected;
    EXPECT_EQ(std::memcmp(&device, &expected, sizeof(double)), 0)
        << "trial " << trial << ": " << device << " vs " << expected;
  }
  // Element order differs from the lane order somewhere in these trials (the test can tell orders apart).
  int differs = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> x = random_floats(kShardBlock, rng, 1.0f);
    double serial = 0;
    for (float v : x) serial += double(v) * double(v);
    differs += serial != block_squares(x.data());
  }
  EXPECT_GT(differs, 0);
}

}  // namespace
}  // namespace engine
