// causal_attention: multi-head causal self-attention from packed q, k, v, fused forward and backward
// that never store the T x T attention matrix (each row is recomputed from the saved log-sum-exp).
// Grouped-query attention (Llama 2/3, Mistral): kv_heads key/value heads, each shared by
// n_head / kv_heads consecutive query heads; kv_heads == n_head is ordinary multi-head attention.
//
//   qkv (B, T, (H + 2 KV) hd) laid out [q (H hd) | k (KV hd) | v (KV hd)], heads of size hd
//   -> out (B, T, H hd)  and  lse (B, H, T): log-sum-exp of each query's scaled scores
//   out[b, t, h] = sum_{s <= t} softmax_s(q_{t,h} . k_{s,g(h)} / sqrt(hd)) v_{s,g(h)},  g(h) = h / (H / KV)
//
// Backward (causal_attention_backward) recomputes the probabilities from lse:
// dv_s += p_ts do_t,  ds_ts = p_ts (do_t . v_s - do_t . out_t),  dq_t += ds_ts k_s / sqrt(hd),
// dk_s += ds_ts q_t / sqrt(hd), with do_t . out_t summed as sum_s p_ts do_t . v_s from the fp32
// probabilities (the stored out, rounded in 16-bit storage, is not read). The K/V gradients of a
// group sum over its query heads. Work is split over (batch, kv head) and a group's query heads run
// in order, so sums run in a fixed order.
//
// Both kernels take 64 queries at a time and do the matrix work as GEMMs (scores, P V and, backward,
// P^T dO, dO V^T, dS K, dS^T Q) over the keys up to the block's last query only. In bf16 or fp16
// storage they widen the tiles a block reads into per-thread fp32 scratch and round what they
// write; the log-sum-exp stays fp32.
#pragma once

#include "op_util.h"

namespace engine::ops {

// kv_heads 0 means n_head (no grouping).
// With position ids (B, T) i32 (packed documents), a query at t attends to keys
// [t - positions[t], t] only: its own document.
ValueId causal_attention(Graph& g, ValueId qkv, int64_t n_head, const std::string& name, int64_t kv_heads = 0,
                         ValueId positions = kNoValue);

extern const OpDef kCausalAttention, kCausalAttentionBackward;

// run.deterministic: false on a GPU plan: every causal_attention_backward node that runs on cuDNN
// (nn/attention_cudnn.h cudnn_attention_supports: 16-bit values, a build with cuDNN, head sizes it
// takes) may sum its query gradient in the order cuDNN's blocks finish (cuDNN SDPA's
// non-deterministic backward), marked in the node's attrs.ints[2]. Returns how many nodes it
// marked. The engine's own attention kernels (fp32, the CPU, the rest) sum in a fixed order.
int allow_unordered_attention_sums(Graph& g);
bool attention_sums_unordered(const Node& node);

}  // namespace engine::ops
