// linear: y = x W^T + b, the fully connected layer (PyTorch's nn.Linear layout: W is (out, in)).
//
//   x (..., K)  W (M, K)  b (M) or none  ->  y (..., M)
//
// Backward: dx = dy W (linear_backward_input); dW += dy^T x and db += sum over rows of dy
// (linear_backward_weight), accumulated so micro-batches and tied weights add up.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId linear(Graph& g, ValueId x, ValueId w, ValueId b, const std::string& name);

extern const OpDef kLinear, kLinearBackwardInput, kLinearBackwardWeight;

// dW (M, K) += dy^T x for dy (rows, M) and x (rows, K) in `type` (f32 or 16-bit), dW in fp32: the
// weight gradient's product as linear_backward_weight computes it (bench/linear_weight_bench.cpp).
void linear_weight_gradient(const void* dy, const void* x, DType type, int64_t rows, int64_t m, int64_t k, float* dw);

// db (m) += dy's column sums over its rows, dy (rows, m) in `type`: each column summed in double in
// row order, whatever the thread count, and added once in db's type (the bias gradient's CPU kernel).
void add_bias_gradient(const void* dy, DType type, int64_t rows, int64_t m, void* db, DType db_type);

}  // namespace engine::ops
