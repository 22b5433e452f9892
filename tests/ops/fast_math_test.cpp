// fast_exp and fast_tanh against std::exp and std::tanh (in double) over the whole float line:
// NaN, the infinities, the largest floats, the overflow and underflow edges, subnormal and tiny
// inputs, a fine sweep of the finite range and random bit patterns. Each input runs through the
// scalar functions, through a vectorised loop and through the AVX2 and AVX-512 twins of fast_exp,
// which must all agree bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu_isa.h"
#include "nn/fast_math.h"
#include "nn/fast_math_avx2.h"
#include "nn/fast_math_avx512.h"

namespace engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The spacing of floats at |v| (subnormal spacing below FLT_MIN).
double ulp(double v) {
  v = std::abs(v);
  if (v < FLT_MIN) return std::ldexp(1.0, -149);
  return std::ldexp(1.0, std::ilogb(v) - 23);
}

// Whether `got` is `want` (exact, in double) within `ulps` float ulps plus `absolute`, where +-inf
// stands for any value beyond FLT_MAX.
::testing::AssertionResult close(float got, double want, double ulps, double absolute, float x) {
  auto fail = [&] {
    char bits[16];
    std::snprintf(bits, sizeof bits, "%08x", std::bit_cast<uint32_t>(x));
    return ::testing::AssertionFailure() << "at x = " << x << " (bits " << bits << "): got " << got << ", want "
                                         << want;
  };
  if (std::isnan(want)) return std::isnan(got) ? ::testing::AssertionSuccess() : fail();
  if (std::isnan(got)) return fail();
  const double slack = ulps * ulp(FLT_MAX);
  if (std::isinf(got))
    return (got > 0) == (want > 0) && std::abs(want) >= double(FLT_MAX) - slack ? ::testing::AssertionSuccess()
                                                                                : fail();
  if (std::abs(want) > double(FLT_MAX) + slack) return fail();  // must have overflowed
  return std::abs(double(got) - want) <= ulps * ulp(want) + absolute ? ::testing::AssertionSuccess() : fail();
}

std::vector<float> edge_inputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x{nan,      -nan,    std::bit_cast<float>(0x7f800001u),  // a signalling NaN
                       kInf,     -kInf,   FLT_MAX,
                       -FLT_MAX, 1e30f,   -1e30f,
                       1e10f,    -1e10f,  200.0f,
                       -200.0f,  104.0f,  -104.0f,
                       -103.9f,  -103.3f, -100.0f,
                       -90.0f,   -87.4f,  -87.3f,
                       -87.0f,   89.0f,   88.8f,
                       88.72f,   88.7f,   88.5f,
                       88.3f,    44.4f,   -44.4f,
                       9.0f,     -9.0f,   0.0f,
                       -0.0f,    FLT_MIN, -FLT_MIN,
                       1e-40f,   -1e-40f, std::numeric_limits<float>::denorm_min(),
                       1e-30f,   -1e-30f, 1e-10f,
                       -1e-10f,  1e-4f,   -1e-4f};
  for (float v = -110.0f; v <= 95.0f; v += 0.0137f) x.push_back(v);
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
  return x;
}

// The vectorised form of the loops the kernels run.
std::vector<float> exp_loop(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  const float* in = x.data();
  float* out = y.data();
  const auto n = int64_t(x.size());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = ops::fast_exp(in[i]);
  return y;
}

std::vector<float> tanh_loop(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  const float* in = x.data();
  float* out = y.data();
  const auto n = int64_t(x.size());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = ops::fast_tanh(in[i]);
  return y;
}

bool same(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

#if ENGINE_HAS_AVX512_KERNELS
// fast_exp16 over x, 16 at a time (the tail padded with zeros).
ENGINE_TARGET_AVX512 std::vector<float> exp16_loop(const std::vector<float>& x) {
  std::vector<float> padded = x;
  padded.resize((x.size() + 15) / 16 * 16, 0.0f);
  std::vector<float> y(padded.size());
  for (size_t i = 0; i < padded.size(); i += 16)
    _mm512_storeu_ps(y.data() + i, ops::fast_exp16(_mm512_loadu_ps(padded.data() + i)));
  y.resize(x.size());
  return y;
}
#endif

TEST(FastMath, Exp16IsFastExpBitForBit) {
#if ENGINE_HAS_AVX512_KERNELS
  if (kernel_isa() != CpuIsa::avx512) GTEST_SKIP() << "this CPU has no AVX-512: fast_exp16 cannot run here";
  const std::vector<float> x = edge_inputs();
  const std::vector<float> sixteen = exp16_loop(x);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(same(sixteen[i], ops::fast_exp(x[i]))) << "x = " << x[i] << " (bits " << std::bit_cast<uint32_t>(x[i])
                                                       << "): " << sixteen[i] << " vs " << ops::fast_exp(x[i]);
#else
  GTEST_SKIP() << "not an x86-64 build: no AVX-512 kernels";
#endif
}

TEST(FastMath, Exp8IsFastExpBitForBit) {
#if ENGINE_HAS_FAST_EXP8
  std::vector<float> x = edge_inputs();
  x.resize((x.size() + 7) / 8 * 8, 0.0f);
  for (size_t i = 0; i < x.size(); i += 8) {
    float eight[8];
    _mm256_storeu_ps(eight, ops::fast_exp8(_mm256_loadu_ps(x.data() + i)));
    for (size_t j = 0; j < 8; ++j)
      ASSERT_TRUE(same(eight[j], ops::fast_exp(x[i + j])))
          << "x = " << x[i + j] << " (bits " << std::bit_cast<uint32_t>(x[i + j]) << "): " << eight[j] << " vs "
          << ops::fast_exp(x[i + j]);
  }
#else
  GTEST_SKIP() << "not built for AVX2 and FMA: no fast_exp8";
#endif
}

TEST(FastMath, ExpMatchesStdExpEverywhereIncludingNanInfinitiesAndSubnormals) {
  const std::vector<float> x = edge_inputs();
  const std::vector<float> vectorised = exp_loop(x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = ops::fast_exp(x[i]);
    EXPECT_TRUE(close(got, std::exp(double(x[i])), 2.0, 0.0, x[i]));
    EXPECT_TRUE(same(got, vectorised[i])) << "scalar and vector differ at " << x[i];
  }
  EXPECT_EQ(ops::fast_exp(kInf), kInf);
  EXPECT_EQ(ops::fast_exp(-kInf), 0.0f);
  EXPECT_EQ(ops::fast_exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(ops::fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMath, TanhMatchesStdTanhEverywhereIncludingNanAndInfinities) {
  const std::vector<float> x = edge_inputs();
  const std::vector<float> vectorised = tanh_loop(x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = ops::fast_tanh(x[i]);
    // 2 ulp of the result, or (near 0, where 1 - 2/(e^2x + 1) cancels) 2 ulp of 1.
    EXPECT_TRUE(close(got, std::tanh(double(x[i])), 2.0, std::ldexp(1.0, -23), x[i]));
    EXPECT_TRUE(same(got, vectorised[i])) << "scalar and vector differ at " << x[i];
  }
  EXPECT_EQ(ops::fast_tanh(kInf), 1.0f);
  EXPECT_EQ(ops::fast_tanh(-kInf), -1.0f);
  EXPECT_EQ(ops::fast_tanh(FLT_MAX), 1.0f);
  EXPECT_TRUE(std::isnan(ops::fast_tanh(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace engine
