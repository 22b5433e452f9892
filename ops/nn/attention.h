// causal_attention: multi-head causal self-attention from packed q, k, v, fused forward and backward
// that never store the T x T attention matrix (each row is recomputed from the saved log-sum-exp).
//
//   qkv (B, T, 3C) laid out [q | k | v], heads of size hd = C / n_head
//   -> out (B, T, C)  and  lse (B, H, T): log-sum-exp of each query's scaled scores
//   out[b, t, h] = sum_{s <= t} softmax_s(q_t . k_s / sqrt(hd)) v_s
//
// Backward (causal_attention_backward) recomputes the probabilities row by row from lse:
// dv_s += p_ts do_t,  ds_ts = p_ts (do_t . v_s - do_t . out_t),  dq_t += ds_ts k_s / sqrt(hd),
// dk_s += ds_ts q_t / sqrt(hd). Work is split over (batch, head), so sums run in a fixed order.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId causal_attention(Graph& g, ValueId qkv, int64_t n_head, const std::string& name);

extern const OpDef kCausalAttention, kCausalAttentionBackward;

}  // namespace engine::ops
