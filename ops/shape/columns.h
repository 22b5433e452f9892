// Column ranges of the last dimension: how a LoRA adapter's update lands on the part of a fused
// projection it adapts (Llama's q, k or v rows of qkv_proj), and how its gradient is read back.
//
//   add_columns:  out = y, and out[..., offset + j] += scale * d[..., j] for j < width(d)
//                 its gradient: dy passes to y; d gets take_columns(dout, offset, scale)
//   take_columns: out[..., j] (+)= scale * x[..., offset + j] for j < width(out)
//
//   ValueId qkv = ops::linear(g, h, frozen_qkv, kNoValue, "attn.qkv_proj");
//   ValueId q = ops::add_columns(g, qkv, lora_q_update, /*offset=*/0, alpha / rank, "attn.q_proj.lora");
//
// attrs: ints {offset, width}, floats {scale}. fp32 kernels (16-bit values are widened around them).
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId add_columns(Graph& g, ValueId y, ValueId d, int64_t offset, double scale, const std::string& name);
ValueId take_columns(Graph& g, ValueId x, int64_t offset, int64_t width, double scale, const std::string& name);

extern const OpDef kAddColumns, kTakeColumns;

}  // namespace engine::ops
