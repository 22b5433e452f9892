// A linear layer's weight and bias gradients against plain double-precision sums:
// - linear_weight_gradient on a weight tall enough (M >= 8 K, M >= 4096) for its blocked transposed
//   route, M not a multiple of the block: a double dy^T x added to a nonzero dW;
// - the bias gradient, at several thread counts: each column's double sum down the rows, in order.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "graph/graph.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"
#include "random_values.h"

namespace engine::ops {
namespace {

TEST(LinearWeightGradient, TallWeightBlocksMatchTheDoubleProduct) {
  const int64_t rows = 7, m = 2 * 2048 + 301, k = 5;
  for (DType type : {DType::f32, DType::bf16}) {
    if (type != DType::f32 && !matmul_16bit_available(type)) continue;
    std::vector<float> dy(size_t(rows * m)), x(size_t(rows * k)), dw(size_t(m * k));
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int(i * 7 % 17) - 8) / 8.0f;  // exact in bf16
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 5 % 13) - 6) / 4.0f;
    for (size_t i = 0; i < dw.size(); ++i) dw[i] = float(i % 3);
    std::vector<uint16_t> dy16(dy.size()), x16(x.size());
    for (size_t i = 0; i < dy.size(); ++i) dy16[i] = float_to_bf16(dy[i]);
    for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(x[i]);
    std::vector<float> got = dw;
    if (type == DType::f32)
      linear_weight_gradient(dy.data(), x.data(), type, rows, m, k, got.data());
    else
      linear_weight_gradient(dy16.data(), x16.data(), type, rows, m, k, got.data());
    for (int64_t j = 0; j < m; ++j)
      for (int64_t i = 0; i < k; ++i) {
        double sum = dw[size_t(j * k + i)];
        for (int64_t r = 0; r < rows; ++r) sum += double(dy[size_t(r * m + j)]) * x[size_t(r * k + i)];
        ASSERT_NEAR(got[size_t(j * k + i)], sum, 1e-5 * (1 + std::abs(sum)))
            << dtype_name(type) << " dW[" << j << ", " << i << "]";
      }
  }
}

// db from dy, on shapes big enough for the kernel's parallel path: 150 columns (ragged against
// every thread count's ranges) from 300 rows, and 4133 columns (ranges wider than the 2048 columns
// summed at once, the last piece partial) from 10 rows. Each column must be the double sum of its
// rows in row order, rounded once and added to the db it started from, bit for bit at 1, 2, 3 and
// 5 threads.
void expect_row_order_sums(int64_t rows, int64_t out) {
  const int64_t in = 3;
  Graph g;
  const ValueId dy = g.add_activation("dy", Shape{rows, out});
  const ValueId x = g.add_activation("x", Shape{rows, in});
  const ValueId dw = g.add_activation("dw", Shape{out, in});
  const ValueId db = g.add_activation("db", Shape{out});
  const Node node{&kLinearBackwardWeight, {dy, x}, {dw, db}, {}, true, true, "fc"};
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3, 5}) {
    test_util::RandomValues values(g, 11);
    // Sixteenths, and in each column one row of +2^60 followed by one of -2^60: the double sum keeps
    // only what comes after the pair, so any other order or grouping of the rows gives another sum.
    std::vector<float> start(static_cast<size_t>(out)), dy_values(static_cast<size_t>(rows * out));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) {
        const int64_t pair = (j * 7) % (rows - 1);
        dy_values[size_t(r * out + j)] = r == pair       ? 0x1p60f
                                         : r == pair + 1 ? -0x1p60f
                                                         : float((r * 13 + j * 5) % 16 - 7) / 16.0f;
      }
    std::memcpy(const_cast<char*>(values.bytes(dy).data()), dy_values.data(), dy_values.size() * sizeof(float));
    std::memcpy(start.data(), values.bytes(db).data(), start.size() * sizeof(float));
    omp_set_num_threads(threads);
    node.op->cpu(node, values.ctx);
    omp_set_num_threads(before);
    std::vector<float> got(static_cast<size_t>(out));
    std::memcpy(got.data(), values.bytes(db).data(), got.size() * sizeof(float));
    for (int64_t j = 0; j < out; ++j) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += double(dy_values[size_t(r * out + j)]);
      const float expected = start[size_t(j)] + float(sum);
      ASSERT_EQ(std::memcmp(&got[size_t(j)], &expected, sizeof(float)), 0)
          << rows << " x " << out << ", " << threads << " threads, db[" << j << "] = " << got[size_t(j)]
          << ", expected " << expected;
    }
  }
}

TEST(LinearBiasGradient, EachColumnIsItsRowOrderDoubleSumAtEveryThreadCount) {
  expect_row_order_sums(300, 150);
  expect_row_order_sums(10, 2 * 2048 + 37);
}

}  // namespace
}  // namespace engine::ops
