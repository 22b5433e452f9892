// add_norm: the residual connection's add fused with the norm that reads its sum, and the graph
// pass that puts it in a GPU plan.
//
//   add_norm  a (..., C), b (..., C), w (C) [, shift (C)]  ->  s = a + b,  y, mean, rstd = norm(s)
//
// A transformer block adds each sublayer's output to the residual stream, and the next norm reads
// the sum at once (GPT-2's ln_2 and the next block's ln_1, Llama's RMS norms). Unfused, the add
// writes s and the norm reads it back from device memory; fused, a warp writes its row of s and
// normalises the row while it is in cache: one read of the residual stream fewer per norm.
//
// Each element of s is the add's one rounded fp32 sum, stored in s's type, and the norm reads the
// stored value back, so the fused kernel gives the unfused kernels' bits (ops/nn/row_programs.h
// add_norm_forward_row; tests/ops/row_program_test.cpp checks it on 16-bit rows). The CPU kernel is
// the two kernels in turn.
//
// fuse_residual_norms runs after autodiff and recompute (GPU plans, run.fusions). It replaces
//   add(a, b) -> s;  ...;  layernorm or rmsnorm(s, w[, shift]) -> y, mean, rstd
// with add_norm at the norm's position, where no node between reads s or writes a or b, and a, b,
// s and y share a type. Returns how many pairs it fused.
#pragma once

#include "op_util.h"

namespace engine::ops {

extern const OpDef kAddNorm;

int fuse_residual_norms(Graph& g);

}  // namespace engine::ops
