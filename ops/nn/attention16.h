// Causal attention on 16-bit values with 16-bit matrix products (nn/attention.h says what it
// computes): the same blocks of 64 queries as the fp32 kernels, but every product is oneDNN's
// 16-bit matmul (AVX512-BF16 or AMX, fp32 accumulation) reading q, k, v and dO where they are
// stored, instead of an sgemm on tiles widened to fp32. Scores, the softmax, the log-sum-exp and the
// dK/dV sums stay fp32; what a product reads from the kernel's own results (the probabilities P,
// the score gradient dS) is rounded to the 16-bit type first, as FlashAttention does on GPUs.
//
//   if (attention16_applies(node, ctx)) return attention16_forward(node, ctx);
#pragma once

#include "op_util.h"

namespace engine::ops {

// Whether q, k, v and out (backward: dO, q, k, v and dqkv) share one 16-bit type, so that the
// products are 16-bit products: then P and dS are rounded to that type before the products that
// read them, also where the fp32 kernel computes them on widened tiles (nn/attention_blocks.h,
// round_through), so a recipe computes the same on machines with and without a 16-bit matmul.
// Forward: inputs qkv; outputs out, lse. Backward: inputs dout, qkv, out, lse; output dqkv.
bool attention16_types(const Node& node, const KernelContext& ctx);

// attention16_types, and this CPU has a 16-bit matmul for the type.
bool attention16_applies(const Node& node, const KernelContext& ctx);

// Tests compare the two 16-bit paths on one machine: while false, attention16_applies is false.
void set_attention16_enabled(bool enabled);

void attention16_forward(const Node& node, const KernelContext& ctx);
void attention16_backward(const Node& node, const KernelContext& ctx);

}  // namespace engine::ops
