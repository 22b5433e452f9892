// dropout: the mask keeps 1 - p of the elements, scales them by 1 / (1 - p), is the same in the
// backward as in the forward, and changes from step to step but not between runs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "graph/autodiff.h"
#include "nn/dropout.h"
#include "nn/dropout_math.h"
#include "plan/plan.h"
#include "runtime/executor.h"

namespace engine {
namespace {

void sum_cpu(const Node& node, const KernelContext& ctx) {
  double s = 0;
  for (int64_t i = 0; i < ctx.shape(node.inputs[0]).numel(); ++i) s += ctx.f32(node.inputs[0])[i];
  *ctx.f32(node.outputs[0]) = float(s);
}
void sum_grad(GradBuilder& gb, const Node& node) {
  auto t = gb.target(node.inputs[0]);
  gb.emit(kAccumulate, {node.inputs[1]}, {t.value}, t, {}, node.name);
}
const OpDef kSumWithOnes{.name = "sum", .cpu = sum_cpu, .grad = sum_grad};

TEST(Dropout, MaskIsConsistentScaledAndFreshEachStep) {
  const int64_t n = 100'000;
  const double p = 0.3;
  Graph g;
  int unit = g.add_unit("u");
  ValueId x = g.add_param("x", Shape{n}, unit, ParamInit::ones());
  ValueId y = ops::dropout(g, x, p, "drop");
  ValueId ones = g.add_input("ones", Shape{n}, DType::f32);
  ValueId loss = g.add_activation("loss", Shape{1});
  g.add_node(Node{&kSumWithOnes, {y, ones}, {loss}, {}, false, false, "sum"});
  g.set_loss(loss);
  g.mark_forward_end();
  autodiff(g);
  ParameterStore store(g);
  store.initialize(1);
  Executor exec(g, store, 42);
  exec.add_plan("step", plan_step(g, all_nodes(g), {y}));
  std::fill_n(static_cast<float*>(exec.input(ones)), n, 1.0f);

  auto run = [&](uint64_t step) {
    store.zero_micro_grads();
    exec.run("step", step, 0);
    const float* out = exec.value_f32("step", y);
    return std::vector<float>(out, out + n);
  };
  std::vector<float> first = run(0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(first[size_t(i)] == 0.0f || std::abs(first[size_t(i)] - float(1 / (1 - p))) < 1e-6f);
    kept += first[size_t(i)] != 0.0f;
    ASSERT_EQ(store.grad(0)[i], first[size_t(i)]) << "backward mask differs from forward at " << i;
  }
  double expected = double(n) * (1 - p), sigma = std::sqrt(double(n) * p * (1 - p));
  EXPECT_NEAR(double(kept), expected, 5 * sigma);
  EXPECT_EQ(run(0), first) << "same step, same mask";
  EXPECT_NE(run(1), first) << "a new step draws a new mask";
}

// In 16-bit storage dropout computes in fp32 on widened chunks: each output is the fp32 result on
// the widened input, rounded once (and, where the output accumulates, the stored value plus it,
// rounded once), with the fp32 run's mask; lengths off the chunk and random-block boundaries.
TEST(Dropout, SixteenBitStorageIsTheFp32ResultRoundedOnce) {
  for (DType type : {DType::bf16, DType::f16})
    for (int64_t n : {int64_t(7), int64_t(1030), int64_t(70'001)})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " n=" + std::to_string(n) + (accumulate ? " accumulating" : ""));
        Graph g;
        ValueId x = g.add_activation("x", Shape{n}, type);
        ValueId y = g.add_activation("y", Shape{n}, type);
        const Node node{&ops::kDropout, {x}, {y}, Attrs{{17}, {0.25}}, accumulate, false, "drop"};
        const auto size = static_cast<size_t>(n);
        std::vector<uint16_t> x16(size), y16(size);
        std::vector<float> x32(size), y32(size), stored(size);
        for (int64_t i = 0; i < n; ++i) {
          x32[size_t(i)] = float(i % 97) * 0.37f - 11.0f;
          stored[size_t(i)] = float(i % 13) * 0.11f;
        }
        narrow(x32.data(), x16.data(), type, n);
        widen(x16.data(), type, x32.data(), n);  // the values 16-bit storage holds
        narrow(stored.data(), y16.data(), type, n);
        widen(y16.data(), type, stored.data(), n);
        y32 = stored;
        KernelContext ctx;
        ctx.graph = &g;
        ctx.seed = 5;
        ctx.step = 3;
        ctx.pointers = {x32.data(), y32.data()};
        ctx.dtypes = {DType::f32, DType::f32};
        ops::kDropout.cpu(node, ctx);
        ctx.pointers = {x16.data(), y16.data()};
        ctx.dtypes = {type, type};
        ops::kDropout.cpu(node, ctx);
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t expected = type == DType::bf16 ? float_to_bf16(y32[size_t(i)]) : float_to_f16(y32[size_t(i)]);
          ASSERT_EQ(y16[size_t(i)], expected) << i;
        }
      }
}

// dropout_columns on a tensor-parallel rank's columns keeps and scales exactly what dropout keeps of
// those columns of the whole input (the same salt), in fp32 and in 16-bit storage, for each of 3
// ranks of a width off the random blocks' 4.
TEST(Dropout, ColumnsOfASplitInputDropWhatTheWholeInputDrops) {
  const int64_t rows = 37, columns = 30, ranks = 3, width = columns / ranks;
  for (DType type : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(type));
    std::vector<float> whole_in(size_t(rows * columns)), whole_out(whole_in.size());
    for (size_t i = 0; i < whole_in.size(); ++i) whole_in[i] = float(i % 29) * 0.25f + 0.5f;  // exact in bf16, never 0
    Graph g;
    ValueId x = g.add_activation("x", Shape{rows, columns}), y = g.add_activation("y", Shape{rows, columns});
    ValueId xs = g.add_activation("xs", Shape{rows, width}, type),
            ys = g.add_activation("ys", Shape{rows, width}, type);
    KernelContext ctx;
    ctx.graph = &g;
    ctx.seed = 5;
    ctx.step = 3;
    ctx.micro_step = 1;
    ctx.pointers = {whole_in.data(), whole_out.data(), nullptr, nullptr};
    ctx.dtypes = {DType::f32, DType::f32, type, type};
    ops::kDropout.cpu(Node{&ops::kDropout, {x}, {y}, Attrs{{17}, {0.25}}, false, false, "drop"}, ctx);
    int64_t dropped = 0;
    for (int64_t rank = 0; rank < ranks; ++rank) {
      std::vector<float> in32(size_t(rows * width)), out32(in32.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < width; ++k)
          in32[size_t(r * width + k)] = whole_in[size_t(r * columns + rank * width + k)];
      std::vector<uint16_t> in16(in32.size()), out16(in32.size());
      narrow(in32.data(), in16.data(), type == DType::f32 ? DType::bf16 : type, int64_t(in32.size()));
      ctx.pointers[2] = type == DType::f32 ? static_cast<void*>(in32.data()) : in16.data();
      ctx.pointers[3] = type == DType::f32 ? static_cast<void*>(out32.data()) : out16.data();
      for (const OpDef* op : {&ops::kDropoutColumns, &ops::kDropoutColumnsBackward}) {
        op->cpu(Node{op, {xs}, {ys}, Attrs{{17, columns, rank * width}, {0.25}}, false, false, "drop"}, ctx);
        if (type != DType::f32) widen(out16.data(), type, out32.data(), int64_t(out32.size()));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < width; ++k) {
            const float whole = whole_out[size_t(r * columns + rank * width + k)];  // rounded once in 16 bits
            ASSERT_EQ(out32[size_t(r * width + k)], type == DType::f32 ? whole : bf16_to_float(float_to_bf16(whole)))
                << op->name << " rank " << rank << " row " << r << " column " << k;
          }
      }
      for (float v : out32) dropped += v == 0.0f;
    }
    EXPECT_GT(dropped, 0) << "no element dropped: the comparison proves nothing";
  }
}

// dropout_columns as the op harness checks an op (tests/ops/op_harness.h; it is not one of the
// harness's cases, whose references do not see the run's seed, which draws the mask): the forward
// against a plain double-precision reference, y = x / (1 - p) where the word of element
// row * columns + column_begin + k keeps it, and the backward through autodiff against central
// finite differences of that reference, for L = sum(R * y) with random weights R.
TEST(Dropout, ColumnsForwardIsItsReferenceAndItsGradientTheFiniteDifferences) {
  const int64_t rows = 7, width = 5, columns = 15, column_begin = 5, step = 2, micro = 1;
  const uint64_t seed = 9;
  const double p = 0.3;
  Graph g;
  ValueId x = g.add_param("x", Shape{rows, width}, g.add_unit("u"), ParamInit::normal(1.0));
  ValueId y = ops::dropout_columns(g, x, p, columns, column_begin, "drop");
  ValueId weights = g.add_input("weights", Shape{rows, width}, DType::f32);
  ValueId loss = g.add_activation("loss", Shape{1});
  g.add_node(Node{&kSumWithOnes, {y, weights}, {loss}, {}, false, false, "sum"});  // its gradient: R
  g.set_loss(loss);
  g.mark_forward_end();
  autodiff(g);
  ParameterStore store(g);
  store.initialize(seed);
  Executor exec(g, store, seed);
  exec.add_plan("step", plan_step(g, all_nodes(g), {y}));
  std::vector<double> r(size_t(rows * width));
  for (size_t i = 0; i < r.size(); ++i) r[i] = std::sin(double(i) + 0.5);
  for (size_t i = 0; i < r.size(); ++i) static_cast<float*>(exec.input(weights))[i] = float(r[i]);
  store.zero_micro_grads();
  exec.run("step", step, micro);

  // The reference: the salt is the node's place in the graph (the first).
  const ops::DropoutMask mask = ops::DropoutMask::make(p, 0, seed, step, micro);
  auto reference = [&](const std::vector<double>& in) {
    std::vector<double> out(in.size());
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t k = 0; k < width; ++k) {
        const int64_t whole = row * columns + column_begin + k, i = row * width + k;
        const bool kept = mask.block(whole / 4).word[whole % 4] >= uint32_t(p * 4294967296.0);
        out[size_t(i)] = kept ? in[size_t(i)] / (1 - p) : 0.0;
      }
    return out;
  };
  std::vector<double> x0(r.size());
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = store.param(0)[i];
  const std::vector<double> expected = reference(x0);
  const float* out = exec.value_f32("step", y);
  int64_t dropped = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(out[i], expected[i], 1e-6 * (1 + std::abs(expected[i]))) << "forward, element " << i;
    dropped += expected[i] == 0.0;
  }
  EXPECT_GT(dropped, 0) << "no element dropped: the comparison proves nothing";
  const double h = 1e-5;
  for (size_t i = 0; i < x0.size(); ++i) {
    std::vector<double> plus = x0, minus = x0;
    plus[i] += h;
    minus[i] -= h;
    const std::vector<double> up = reference(plus), down = reference(minus);
    double difference = 0;
    for (size_t j = 0; j < up.size(); ++j) difference += r[j] * (up[j] - down[j]);
    const double fd = difference / (2 * h);
    EXPECT_NEAR(store.grad(0)[i], fd, 1e-6 * (1 + std::abs(fd))) << "gradient, element " << i;
  }
}

TEST(Dropout, ProbabilitiesOfOneOrMoreAndNanAreRefused) {
  Graph g;
  ValueId x = g.add_param("x", Shape{4}, g.add_unit("u"), ParamInit::ones());
  for (double p : {1.0, 1.5, double(NAN), double(INFINITY)}) {
    try {
      ops::dropout(g, x, p, "drop");
      ADD_FAILURE() << "dropout " << p << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("layer drop: dropout probability must be below 1"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(ops::dropout(g, x, 0.0, "drop"), x);
}

}  // namespace
}  // namespace engine
