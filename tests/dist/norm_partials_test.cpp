// The gradient norm's list of partial sums is the same at every world size (dist/zero_step.h
// without_padding_blocks): a unit padded for more ranks has more zero blocks after its values, and
// sum_norm_partials adds chunks of 256 partials, whose boundaries would move with them. Random
// partials over units whose sizes are not multiples of the padding: the norm from each world's
// padded list (unit, rank, block, as ZeroStep gathers it) must be one process's bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "dist/zero_step.h"
#include "optim/optimizer.h"

namespace engine {
namespace {

std::vector<Unit> units_of(const std::vector<int64_t>& sizes) {
  std::vector<Unit> units;
  for (int64_t numel : sizes) units.push_back(Unit{.name = "u" + std::to_string(units.size()), .numel = numel});
  return units;
}

// Each unit's padded blocks at `layout`'s world size: the values' partial sums, then zeros.
std::vector<double> padded_list(const ShardLayout& layout, const std::vector<std::vector<double>>& values) {
  std::vector<double> list;
  for (size_t u = 0; u < layout.units(); ++u) {
    list.insert(list.end(), values[u].begin(), values[u].end());
    list.resize(list.size() + size_t(layout.padded(u) / kShardBlock - layout.value_blocks(u)), 0.0);
  }
  return list;
}

TEST(NormPartials, TheListIsTheSameAtEveryWorldSize) {
  // Three large units (303 value blocks each) and two small ones: about 900 partials, so the
  // chunks of 256 cross unit boundaries.
  const std::vector<Unit> units = units_of({7680, 309280, 309280, 309280, 320});
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 4);
  int padded_sums_differ = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const ShardLayout one(units, 1, 0);
    std::vector<std::vector<double>> values(units.size());
    for (size_t u = 0; u < units.size(); ++u)
      for (int64_t b = 0; b < one.value_blocks(u); ++b)
        values[u].push_back(std::ldexp(mantissa(random), exponent(random)));
    const double reference = sum_norm_partials(without_padding_blocks(one, padded_list(one, values)));
    for (int world : {2, 3, 4, 8}) {
      const ShardLayout layout(units, world, 0);
      const std::vector<double> padded = padded_list(layout, values);
      EXPECT_EQ(sum_norm_partials(without_padding_blocks(layout, padded)), reference)
          << "world " << world << ", trial " << trial;
      padded_sums_differ += sum_norm_partials(padded) != reference;
    }
  }
  // What the test guards against: summing the padded lists as they are moves the chunks.
  EXPECT_GT(padded_sums_differ, 0) << "the padded lists' sums never differed: the test shows nothing";
}

TEST(NormPartials, OneProcessKeepsEveryBlock) {
  const ShardLayout one(units_of({5000, 1024, 1}), 1, 0);
  const std::vector<double> list = {1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(without_padding_blocks(one, list), list);
  const ShardLayout two(units_of({5000, 1024, 1}), 2, 0);  // 6, 2 and 2 blocks
  EXPECT_EQ(without_padding_blocks(two, {1, 2, 3, 4, 5, 0, 6, 0, 7, 0}), list);
  EXPECT_THROW(without_padding_blocks(two, list), InternalError);
}

}  // namespace
}  // namespace engine
