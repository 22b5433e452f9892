// The math written once for the CPU and CUDA kernels (nn/activation_math.h, nn/dropout_math.h,
// core/philox.h, elementwise/add_math.h): the CPU kernels give, bit for bit, what the shared scalar
// functions give element by element, so a CUDA kernel calling the same functions (built with
// -fmad=false) gives the CPU's bits. Where the kernels' loops are vectorised, this also catches a
// compiler fusing a multiply-add the shared function does not spell (or the reverse).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/philox.h"
#include "core/rng.h"
#include "elementwise/add.h"
#include "elementwise/add_math.h"
#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/dropout_math.h"
#include "nn/gelu_onednn.h"
#include "random_values.h"
#include "reduce/sum.h"

// The references below add and multiply as written: no contraction of this file's own arithmetic.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace engine {
namespace {

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Inputs over the whole float range: edge values (zeros, infinities, NaN, subnormals, the limits of
// fast_exp's clamps), every 65,537th bit pattern, and normal values around the activations' knees.
// A ragged length, so vector loops run their tails.
std::vector<float> test_inputs() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          1e-45f,
                          -1e-45f,
                          1e-38f,
                          -1e-38f,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          89.0f,
                          -104.0f,
                          88.7f,
                          -103.9f,
                          1.0f,
                          -1.0f};
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 65537) v.push_back(std::bit_cast<float>(uint32_t(bits)));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  while (v.size() < 200'003) v.push_back(normal(rng));
  return v;
}

// Fills `id` with `values` (f32), cycling them with a shift when the value is longer.
void fill(const KernelContext& ctx, ValueId id, const std::vector<float>& values, size_t shift) {
  float* p = ctx.f32(id);
  for (int64_t i = 0; i < ctx.shape(id).numel(); ++i) p[i] = values[(size_t(i) + shift) % values.size()];
}

template <class Reference>
void expect_bits(const KernelContext& ctx, ValueId id, Reference reference, const char* what) {
  const float* got = ctx.f32(id);
  int64_t differ = 0;
  for (int64_t i = 0; i < ctx.shape(id).numel(); ++i) {
    const float want = reference(i);
    if (!same_bits(got[i], want) && !(std::isnan(got[i]) && std::isnan(want))) {
      if (differ++ < 3) ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs shared " << want;
    }
  }
  EXPECT_EQ(differ, 0) << what;
}

class SharedMath : public ::testing::Test {
 protected:
  // The engine's GELU loop (oneDNN's primitive, chosen on AVX-512 machines, has bits of its own).
  void SetUp() override { ops::set_gelu_path(ops::GeluPath::engine); }
  void TearDown() override { ops::set_gelu_path(ops::GeluPath::automatic); }
};

template <class F>
void check_unary(const OpDef& forward_op, const OpDef& backward_op, const char* name) {
  const std::vector<float> inputs = test_inputs();
  const auto n = int64_t(inputs.size());
  Graph g;
  const ValueId x = g.add_activation("x", Shape{n}), y = g.add_activation("y", Shape{n});
  const ValueId dy = g.add_activation("dy", Shape{n}), dx = g.add_activation("dx", Shape{n});
  test_util::RandomValues values(g, 1);
  const KernelContext& ctx = values.ctx;
  fill(ctx, x, inputs, 0);
  forward_op.cpu(Node{&forward_op, {x}, {y}, {}, false, false, name}, ctx);
  expect_bits(
      ctx, y, [&](int64_t i) { return F::forward(ctx.f32(x)[i]); }, name);
  for (bool accumulate : {false, true}) {
    fill(ctx, dy, inputs, 7);
    std::vector<float> before(ctx.f32(dx), ctx.f32(dx) + n);
    backward_op.cpu(Node{&backward_op, {x, dy}, {dx}, {}, accumulate, true, name}, ctx);
    expect_bits(
        ctx, dx,
        [&](int64_t i) {
          const float d = F::derivative(ctx.f32(x)[i]), g_ = ctx.f32(dy)[i];
          return accumulate ? ops::accumulate_product(before[size_t(i)], d, g_) : d * g_;
        },
        accumulate ? "backward, accumulating" : "backward");
  }
}

TEST_F(SharedMath, GeluKernelsGiveTheSharedFunctionsBits) {
  check_unary<ops::Gelu>(ops::kGelu, ops::kGeluBackward, "gelu");
}
TEST_F(SharedMath, SiluKernelsGiveTheSharedFunctionsBits) {
  check_unary<ops::Silu>(ops::kSilu, ops::kSiluBackward, "silu");
}
TEST_F(SharedMath, ReluKernelsGiveTheSharedFunctionsBits) {
  check_unary<ops::Relu>(ops::kRelu, ops::kReluBackward, "relu");
}

TEST_F(SharedMath, SwigluKernelsGiveTheSharedFunctionsBits) {
  const std::vector<float> inputs = test_inputs();
  const auto n = int64_t(inputs.size());
  Graph g;
  const ValueId a = g.add_activation("a", Shape{n}), b = g.add_activation("b", Shape{n});
  const ValueId y = g.add_activation("y", Shape{n}), dy = g.add_activation("dy", Shape{n});
  const ValueId da = g.add_activation("da", Shape{n}), db = g.add_activation("db", Shape{n});
  test_util::RandomValues values(g, 2);
  const KernelContext& ctx = values.ctx;
  fill(ctx, a, inputs, 0);
  fill(ctx, b, inputs, 3);
  fill(ctx, dy, inputs, 5);
  ops::kSwiglu.cpu(Node{&ops::kSwiglu, {a, b}, {y}, {}, false, false, "swiglu"}, ctx);
  expect_bits(
      ctx, y, [&](int64_t i) { return ops::swiglu_forward(ctx.f32(a)[i], ctx.f32(b)[i]); }, "swiglu");
  for (int mode = 0; mode < 4; ++mode) {
    const bool acc_a = (mode & 1) != 0, acc_b = (mode & 2) != 0;
    const std::vector<float> da0(ctx.f32(da), ctx.f32(da) + n), db0(ctx.f32(db), ctx.f32(db) + n);
    ops::kSwigluBackward.cpu(
        Node{&ops::kSwigluBackward, {a, b, dy}, {da, db}, Attrs{{acc_a ? 1 : 0, acc_b ? 1 : 0}, {}}, false, true, "s"},
        ctx);
    // An accumulated swiglu gradient is added after rounding (the CPU loop does not fuse it).
    expect_bits(
        ctx, da,
        [&](int64_t i) {
          const float v = ops::swiglu_grad_a(ctx.f32(a)[i], ctx.f32(b)[i], ctx.f32(dy)[i]);
          return acc_a ? da0[size_t(i)] + v : v;
        },
        "swiglu da");
    expect_bits(
        ctx, db,
        [&](int64_t i) {
          const float v = ops::swiglu_grad_b(ctx.f32(a)[i], ctx.f32(dy)[i]);
          return acc_b ? db0[size_t(i)] + v : v;
        },
        "swiglu db");
  }
}

TEST(SharedMathAdd, AddKernelGivesTheSharedFunctionsBits) {
  const std::vector<float> inputs = test_inputs();
  const auto n = int64_t(inputs.size());
  Graph g;
  const ValueId a = g.add_activation("a", Shape{n}), b = g.add_activation("b", Shape{n});
  const ValueId y = g.add_activation("y", Shape{n});
  test_util::RandomValues values(g, 3);
  const KernelContext& ctx = values.ctx;
  fill(ctx, a, inputs, 0);
  fill(ctx, b, inputs, 1);
  ops::kAdd.cpu(Node{&ops::kAdd, {a, b}, {y}, {}, false, false, "add"}, ctx);
  expect_bits(
      ctx, y, [&](int64_t i) { return ops::add_values(ctx.f32(a)[i], ctx.f32(b)[i]); }, "add");
}

// Random123's known-answer vectors for Philox4x32-10, and rng.h's philox4x32 equal to the shared one.
TEST(SharedMathPhilox, KnownAnswersAndTheCpuGenerator) {
  struct PhiloxCase {
    PhiloxWords counter;
    PhiloxKey key;
    PhiloxWords want;
  };
  const PhiloxCase cases[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const PhiloxCase& c : cases) {
    const PhiloxWords got = philox4x32_10(c.counter, c.key);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got.word[j], c.want.word[j]) << "word " << j;
  }
  std::mt19937 rng(5);
  auto word = [&] { return uint32_t(rng()); };
  for (int trial = 0; trial < 1000; ++trial) {
    const std::array<uint32_t, 4> counter{word(), word(), word(), word()};
    const std::array<uint32_t, 2> key{word(), word()};
    const PhiloxWords shared = philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}}, {{key[0], key[1]}});
    const std::array<uint32_t, 4> cpu = philox4x32(counter, key);
    for (int j = 0; j < 4; ++j) ASSERT_EQ(cpu[size_t(j)], shared.word[j]);
  }
}

// The dropout kernel's output is DropoutMask's, element by element, overwriting and accumulating,
// with a ragged length (the last Philox block part used).
TEST(SharedMathDropout, KernelGivesTheSharedMasksBits) {
  const int64_t n = 100'003;
  const double p = 0.3;
  Graph g;
  const ValueId x = g.add_activation("x", Shape{n}), y = g.add_activation("y", Shape{n});
  test_util::RandomValues values(g, 4);
  KernelContext& ctx = values.ctx;
  ctx.seed = 0x123456789abcdefull;
  ctx.step = 17;
  ctx.micro_step = 3;
  const int64_t salt = 42;
  const ops::DropoutMask mask = ops::DropoutMask::make(p, salt, ctx.seed, ctx.step, ctx.micro_step);
  for (bool accumulate : {false, true}) {
    const std::vector<float> before(ctx.f32(y), ctx.f32(y) + n);
    ops::kDropout.cpu(Node{&ops::kDropout, {x}, {y}, Attrs{{salt}, {p}}, accumulate, false, "drop"}, ctx);
    int64_t kept = 0;
    expect_bits(
        ctx, y,
        [&](int64_t i) {
          const float v = mask.apply(mask.block(i / 4).word[i % 4], ctx.f32(x)[i]);
          kept += v != 0.0f;
          return accumulate ? before[size_t(i)] + v : v;
        },
        accumulate ? "dropout, accumulating" : "dropout");
    EXPECT_NEAR(double(kept) / double(n), 1 - p, 0.01);
  }
  // The stream the kernel drew before the shared function (rng.h's philox4x32 with the same counter).
  const std::array<uint32_t, 2> key{uint32_t(ctx.seed), uint32_t(ctx.seed >> 32) ^ 0x64726f70u};
  for (int64_t block : {int64_t(0), int64_t(1), int64_t(25000)}) {
    const auto old = philox4x32({uint32_t(block), uint32_t(salt), 17u, 3u}, key);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(mask.block(block).word[j], old[size_t(j)]);
  }
}

// reduce_sum: each row in order in double (the CUDA kernel's order); reduce_backward: the product
// rounded once per row, added after rounding.
TEST(SharedMathReduce, SumsInRowOrderAndBroadcastsOneRoundedProduct) {
  const int64_t rows = 37, n = 1001;
  Graph g;
  const ValueId x = g.add_activation("x", Shape{rows, n}), y = g.add_activation("y", Shape{rows});
  const ValueId dx = g.add_activation("dx", Shape{rows, n});
  test_util::RandomValues values(g, 6);
  const KernelContext& ctx = values.ctx;
  const double factor = 1.0 / double(n);
  ops::kReduceSum.cpu(Node{&ops::kReduceSum, {x}, {y}, Attrs{{}, {factor}}, false, false, "mean"}, ctx);
  expect_bits(
      ctx, y,
      [&](int64_t r) {
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += ctx.f32(x)[r * n + i];
        return float(sum * factor);
      },
      "reduce_sum");
  for (bool accumulate : {false, true}) {
    const std::vector<float> before(ctx.f32(dx), ctx.f32(dx) + rows * n);
    ops::kReduceBackward.cpu(Node{&ops::kReduceBackward, {y}, {dx}, Attrs{{}, {factor}}, accumulate, true, "mean"},
                             ctx);
    expect_bits(
        ctx, dx,
        [&](int64_t i) {
          const float v = ctx.f32(y)[i / n] * float(factor);
          return accumulate ? before[size_t(i)] + v : v;
        },
        accumulate ? "reduce_backward, accumulating" : "reduce_backward");
  }
}

}  // namespace
}  // namespace engine
