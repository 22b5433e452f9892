// 16-bit float conversions against independent references: the compiler's own _Float16
// conversion (round to nearest even, done by the toolchain) and a double-precision search for the
// nearest bfloat16.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

namespace engine {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u16})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_FALSE(parse_dtype("float32"));
}

// The compiler's _Float16 is the reference where it exists (GCC 12 on x86-64; not clang 14).
#ifdef __FLT16_MAX__
TEST(DType, F16DecodesEveryBitPatternLikeTheCompiler) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float expected = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(bits)));
    float got = f16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << bits;
    }
  }
}

TEST(DType, F16EncodesLikeTheCompiler) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> any_bits;
  auto check = [](float x) {
    uint16_t expected = std::bit_cast<uint16_t>(static_cast<_Float16>(x));
    uint16_t got = float_to_f16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f16_to_float(got)));
    } else {
      ASSERT_EQ(got, expected) << x;
    }
  };
  for (int i = 0; i < 2'000'000; ++i) check(std::bit_cast<float>(any_bits(rng)));
  // Every f16 value, and the exact midpoints between neighbours (ties to even).
  for (uint32_t bits = 0; bits < 0x7c00; ++bits) {
    float low = f16_to_float(static_cast<uint16_t>(bits));
    float high = f16_to_float(static_cast<uint16_t>(bits + 1));
    check(low);
    check(-low);
    check(static_cast<float>((static_cast<double>(low) + high) / 2));
  }
  check(65504.0f);
  check(65519.99f);
  check(65520.0f);
  check(std::ldexp(1.0f, -25));
}
#else
TEST(DType, F16AgainstTheCompiler) { GTEST_SKIP() << "this compiler has no _Float16 to compare against"; }
#endif

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float x = f16_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(x)) {
      EXPECT_EQ(float_to_f16(x), bits);
    }
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
}

// Nearest bfloat16 by brute force in double, ties to even.
uint16_t reference_bf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint16_t down = static_cast<uint16_t>(bits >> 16);
  uint16_t up = static_cast<uint16_t>(down + 1);
  double dx = x, dd = bf16_to_float(down), du = bf16_to_float(up);
  if (std::isinf(du)) du = std::ldexp(1.0, 128) * (x < 0 ? -1 : 1);  // the value past the largest
  double error_down = std::abs(dx - dd), error_up = std::abs(dx - du);
  if (error_down < error_up) return down;
  if (error_up < error_down) return up;
  return (down & 1) ? up : down;
}

TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) {
    float x = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(x))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(x), reference_bf16(x)) << x;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
}

TEST(DType, Bf16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float x = bf16_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(x)) {
      EXPECT_EQ(float_to_bf16(x), bits);
    }
  }
}

}  // namespace
}  // namespace engine
