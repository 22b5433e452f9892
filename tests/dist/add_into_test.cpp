// add_into: the one reduction step every collective is made of, per dtype, against a plain loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "dist/communicator.h"

namespace engine {
namespace {

// Values over many magnitudes, so a sum that is not rounded per element (or is rounded to the
// wrong type) shows.
std::vector<float> values(int seed, int count) {
  std::vector<float> out(count);
  uint32_t state = 2654435761u * static_cast<uint32_t>(seed + 1);
  for (int i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    float mantissa = 1.0f + static_cast<float>(state >> 9) / static_cast<float>(1u << 23);
    int exponent = static_cast<int>((state >> 3) % 24) - 12;
    out[i] = ((state & 1) ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
  }
  return out;
}

TEST(AddInto, F32IsTheElementwiseFloatSum) {
  std::vector<float> a = values(1, 1003), b = values(2, 1003), expected(1003);
  for (size_t i = 0; i < a.size(); ++i) expected[i] = a[i] + b[i];
  add_into(a.data(), b.data(), 1003, DType::f32);
  EXPECT_EQ(0, std::memcmp(a.data(), expected.data(), a.size() * sizeof(float)));
}

template <typename To, typename From>
void check_16bit(DType dtype, To to_bits, From from_bits) {
  std::vector<float> fa = values(3, 517), fb = values(4, 517);
  std::vector<uint16_t> a(517), b(517), expected(517);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = to_bits(fa[i]);
    b[i] = to_bits(fb[i]);
    expected[i] = to_bits(from_bits(a[i]) + from_bits(b[i]));
  }
  add_into(a.data(), b.data(), 517, dtype);
  EXPECT_EQ(a, expected);
  // Twice in a row rounds twice: the accumulator is the 16-bit value, not a hidden float.
  std::vector<uint16_t> twice = expected;
  add_into(twice.data(), b.data(), 517, dtype);
  for (size_t i = 0; i < a.size(); ++i) expected[i] = to_bits(from_bits(expected[i]) + from_bits(b[i]));
  EXPECT_EQ(twice, expected);
}

TEST(AddInto, Bf16RoundsEachSumToBf16) { check_16bit(DType::bf16, float_to_bf16, bf16_to_float); }
TEST(AddInto, F16RoundsEachSumToF16) { check_16bit(DType::f16, float_to_f16, f16_to_float); }

TEST(AddInto, ZeroCountTouchesNothing) {
  float a = 1.5f, b = 2.0f;
  add_into(&a, &b, 0, DType::f32);
  EXPECT_EQ(a, 1.5f);
}

TEST(AddInto, RefusesIntegerTypes) {
  int32_t a = 1, b = 2;
  EXPECT_THROW(add_into(&a, &b, 1, DType::i32), InternalError);
}

}  // namespace
}  // namespace engine
