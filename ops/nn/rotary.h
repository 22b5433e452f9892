// rotary: rotary position embedding applied to the q and k parts of packed qkv (Llama), in the
// "rotate half" convention of Hugging Face's Llama: within each head, element i pairs with i + hd/2.
// Hugging Face's q_proj and k_proj weights are already permuted for this convention (its conversion
// script does it for Meta's interleaved checkpoints), so they load unchanged.
//
//   qkv (B, T, (H + 2 KV) hd) laid out [q (H heads) | k (KV heads) | v (KV heads)] -> the same shape
//   angle(t, i) = t * theta^(-2i / hd),  i < hd / 2  (rescaled as rope_scaling says: nn/rotary_math.h)
//   (x_i, x_{i+hd/2}) -> (x_i cos - x_{i+hd/2} sin,  x_i sin + x_{i+hd/2} cos);  v is copied
//
// Backward rotates the gradient by the opposite angle (the rotation is orthogonal).
#pragma once

#include "nn/rotary_math.h"
#include "op_util.h"

namespace engine::ops {

// kv_heads 0 means n_head.
// With position ids (B, T) i32 (packed documents), a token is rotated by its position ids[b, t]
// rather than t.
ValueId rotary(Graph& g, ValueId qkv, int64_t n_head, const RopeFrequencies& frequencies, const std::string& name,
               int64_t kv_heads = 0, ValueId positions = kNoValue);

// The frequencies a rotary node was built with (its attributes).
RopeFrequencies rope_frequencies(const Attrs& attrs);

extern const OpDef kRotary, kRotaryBackward;

}  // namespace engine::ops
