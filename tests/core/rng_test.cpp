// Philox against the Random123 known-answer vectors, and the stream properties the engine relies on.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace engine {
namespace {

TEST(Philox, KnownAnswerVectors) {
  using Words = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(RandomStream, SameSeedAndPurposeGiveTheSameNumbers) {
  RandomStream a(1337, RandomPurpose::init), b(1337, RandomPurpose::init);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.next_u32(), b.next_u32());
}

TEST(RandomStream, PurposesAndSeedsAreIndependentStreams) {
  RandomStream init(1337, RandomPurpose::init), data(1337, RandomPurpose::data), other(1338, RandomPurpose::init);
  int equal_purpose = 0, equal_seed = 0;
  for (int i = 0; i < 1000; ++i) {
    uint32_t x = init.next_u32();
    equal_purpose += x == data.next_u32();
    equal_seed += x == other.next_u32();
  }
  EXPECT_LT(equal_purpose, 3);
  EXPECT_LT(equal_seed, 3);
}

TEST(RandomStream, ResumesFromASavedPosition) {
  RandomStream a(5, RandomPurpose::dropout);
  for (int i = 0; i < 13; ++i) a.next_u32();
  RandomStream resumed(5, RandomPurpose::dropout, a.position());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u32(), resumed.next_u32());
}

// Each normal takes four words (two uniforms), so the k-th normal of a stream is the first of the
// stream started at word 4 k: what the parallel initialisation relies on. Off a block boundary a
// normal is still the two uniforms it is made of.
TEST(RandomStream, TheKthNormalIsTheFirstAtWordFourK) {
  RandomStream sequential(7, RandomPurpose::init);
  for (uint64_t k = 0; k < 300; ++k) {
    const float value = sequential.normal();
    RandomStream at(7, RandomPurpose::init, 4 * k);
    ASSERT_EQ(at.normal(), value) << k;
    EXPECT_EQ(at.position(), 4 * (k + 1));
  }
  RandomStream offset(7, RandomPurpose::init, 1), words(7, RandomPurpose::init, 1);
  const double u1 = 1.0 - words.uniform(), u2 = words.uniform();
  EXPECT_EQ(offset.normal(),
            static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2)));
  EXPECT_EQ(offset.position(), 5u);
}

TEST(RandomStream, UniformAndNormalHaveTheRightMoments) {
  RandomStream s(9, RandomPurpose::test);
  const int n = 400'000;
  double sum_u = 0, sum_u2 = 0, sum_n = 0, sum_n2 = 0, sum_n4 = 0;
  for (int i = 0; i < n; ++i) {
    double u = s.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum_u += u;
    sum_u2 += u * u;
    double z = s.normal();
    sum_n += z;
    sum_n2 += z * z;
    sum_n4 += z * z * z * z;
  }
  // Tolerances are about 5 standard errors of each estimate.
  EXPECT_NEAR(sum_u / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(sum_u2 / n, 1.0 / 3, 5 * std::sqrt(4.0 / 45 / n));
  EXPECT_NEAR(sum_n / n, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(sum_n2 / n, 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_NEAR(sum_n4 / n, 3.0, 5 * std::sqrt(96.0 / n));
}

TEST(RandomStream, BelowIsUniformOverItsRange) {
  RandomStream s(3, RandomPurpose::test);
  std::vector<int> counts(7, 0);
  const int n = 70'000;
  for (int i = 0; i < n; ++i) counts[s.below(7)]++;
  double chi2 = 0;
  for (int c : counts) chi2 += (c - n / 7.0) * (c - n / 7.0) / (n / 7.0);
  EXPECT_LT(chi2, 22.5);  // chi-squared, 6 degrees of freedom, p = 0.001
}

}  // namespace
}  // namespace engine
