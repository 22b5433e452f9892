// linear_weight_gradient on a weight tall enough (M >= 8 K, M >= 4096) for its blocked transposed
// route, M not a multiple of the block: against a double-precision dy^T x added to a nonzero dW.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"

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

}  // namespace
}  // namespace engine::ops
