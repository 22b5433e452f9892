// linear_gelu and linear_backward_input_gelu: GELU fused with the products on either side of it, and
// the graph pass that puts them in a GPU plan (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD epilogues:
// GELU computed where the product's tile is still in registers, so its input is never read back).
//
//   linear_gelu                 x (..., K), W (M, K), b (M)  ->  a = x W^T + b, f = gelu(a)
//   linear_backward_input_gelu  dy (..., N), W2 (N, M), a    ->  da = gelu'(a) (dy W2)
//
// The pass (fuse_linear_gelu) runs after autodiff and recompute. It replaces
//   forward   linear(x, W, b) -> a;  gelu(a) -> f
//   backward  linear_backward_input(dy, W2) -> df;  gelu_backward(a, df) -> da
// with linear_gelu(x, W, b) -> a, f and linear_backward_input_gelu(dy, W2, a) -> da: the same
// values, one kernel fewer each way, and df never exists. GPT's MLP is this pattern (c_fc, gelu,
// c_proj). The bias gradient of c_fc stays with its weight gradient's product (BGRADB):
// cuBLASLt 13 on an H100 offers no DGELU_BGRAD algorithm with f32 sums, and with bf16 sums it ran
// at a third of DGELU's speed (bench/cublaslt_candidates).
//
// The CPU kernels are the unfused kernels run in turn, so a fused CPU plan gives the unfused plan's
// bits where the products take the values in their own types (f32, and 16-bit types the CPU's
// matmul computes natively; where the executor widens them, GELU reads the unrounded product;
// CudaHarness checks both); the engine fuses only GPU plans, where cuBLASLt's GELU (the same tanh
// form, its own rounding) differs from the engine's GELU kernel in the last bits. Where cuBLASLt has
// no such epilogue for a shape or type, the CUDA kernels run the unfused kernels too.
//
//   autodiff(g);
//   apply_recompute(g, policy);
//   const GeluFusions fused = fuse_linear_gelu(g);   // GPU plans (run.fusions)
#pragma once

#include <cstdint>

#include "op_util.h"

namespace engine::ops {

extern const OpDef kLinearGelu, kLinearBackwardInputGelu;

struct GeluFusions {
  int forward = 0;   // linear + gelu pairs fused
  int backward = 0;  // linear_backward_input + gelu_backward pairs fused
};
GeluFusions fuse_linear_gelu(Graph& g);

}  // namespace engine::ops

namespace engine::cuda {

// How many of the fused nodes' runs in this process took cuBLASLt's epilogue, and how many ran the
// unfused kernels (no algorithm for the shape or types).
struct GeluProducts {
  int64_t fused = 0, composed = 0;
};
GeluProducts gelu_products();

}  // namespace engine::cuda
