// The CUDA kernels of the ops, one entry point per kernel, each with the contract of the CPU
// kernel its OpDef names beside it (same inputs, outputs, attributes and accumulate rule), on
// device pointers, enqueued on the context's stream.
//
// ENGINE_CUDA_KERNELS is the one list: this header declares every entry, and a build without CUDA
// defines each in ops/no_cuda.cpp as a kernel that throws "op X has no CUDA kernel in this build".
// A CUDA build defines each in ops/<family>/<op>.cu.
//
//   const OpDef kGelu{.name = "gelu", .cpu = unary_cpu<Gelu>, .cuda = cuda::gelu, ...};
#pragma once

#include "graph/op.h"

#define ENGINE_CUDA_KERNELS(X)  \
  X(copy)                       \
  X(cast)                       \
  X(add)                        \
  X(host_copy)                  \
  X(gelu)                       \
  X(gelu_backward)              \
  X(relu)                       \
  X(relu_backward)              \
  X(silu)                       \
  X(silu_backward)              \
  X(swiglu)                     \
  X(swiglu_backward)            \
  X(dropout_mask)               \
  X(reduce_sum)                 \
  X(reduce_backward)            \
  X(transpose)                  \
  X(add_columns)                \
  X(take_columns)               \
  X(norm)                       \
  X(add_norm)                   \
  X(norm_backward)              \
  X(softmax)                    \
  X(softmax_backward)           \
  X(cross_entropy)              \
  X(embedding)                  \
  X(embedding_backward)         \
  X(rotary)                     \
  X(rotary_backward)            \
  X(attention)                  \
  X(attention_backward)         \
  X(linear)                     \
  X(linear_backward_input)      \
  X(linear_backward_weight)     \
  X(linear_gelu)                \
  X(linear_backward_input_gelu) \
  X(matmul)

namespace engine::cuda {

#define ENGINE_DECLARE_CUDA_KERNEL(name) void name(const Node& node, const KernelContext& ctx);
ENGINE_CUDA_KERNELS(ENGINE_DECLARE_CUDA_KERNEL)
#undef ENGINE_DECLARE_CUDA_KERNEL

}  // namespace engine::cuda
