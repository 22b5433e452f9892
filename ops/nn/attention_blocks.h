// The pieces both causal-attention kernels share (nn/attention.h): the block size, the layout of
// the packed qkv rows, per-thread scratch, rounding a row into 16-bit storage, and the row loops of
// a block of queries (softmax, the recomputed probabilities, the score gradient) at the process's
// vector ISA (core/cpu_isa.h).
//
// attention.cpp multiplies fp32 tiles with sgemm (16-bit values widened in cache); attention16.cpp
// multiplies 16-bit tiles in place with oneDNN's 16-bit matmul where the CPU has one.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/convert.h"
#include "op_util.h"

namespace engine::ops::attention_detail {

// Both kernels work on blocks of kBlock queries: the block's scores against every key it sees
// (S = Q K^T over keys [0, last query], the keys above the diagonal never computed), the causal
// softmax of those rows, and the products with V (and, backward, with dO, K and Q) as GEMMs.
// 64 rows keep a block's scores (64 x T floats) and its q, k, v tiles in L2 at T = 1024.
inline constexpr int64_t kBlock = 64;

// channels: the width of q and of the output (H hd); kv_channels: the width of k and of v (KV hd).
struct Dims {
  int64_t batch, time, channels, heads, kv_heads, head_size, kv_channels, row;
  int64_t group() const { return heads / kv_heads; }
  int64_t blocks() const { return (time + kBlock - 1) / kBlock; }
  // Offsets in a row of qkv of query head h, and of the key and value heads it reads.
  int64_t q(int64_t h) const { return h * head_size; }
  int64_t k(int64_t h) const { return channels + (h / group()) * head_size; }
  int64_t v(int64_t h) const { return channels + kv_channels + (h / group()) * head_size; }
};

inline Dims dims_of(const Shape& s, const Node& node) {
  int64_t h = node.attrs.ints[0], kv = node.attrs.ints[1], hd = s[2] / (h + 2 * kv);
  return {s[0], s[1], h * hd, h, kv, hd, kv * hd, s[2]};
}

// dst[offset, offset + n) in `type` = (or += when accumulating) src, rounded once.
inline void store_row(float* src, void* dst, DType type, int64_t offset, int64_t n, bool accumulate) {
  if (type == DType::f32) {
    float* d = static_cast<float*>(dst) + offset;
    if (accumulate) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) d[i] += src[i];
    } else {
      std::copy_n(src, n, d);
    }
    return;
  }
  auto* d = static_cast<uint16_t*>(dst) + offset;
  if (accumulate) widen_serial(d, type, src, n, true);  // src = stored + fresh
  narrow_serial(src, d, type, n);
}

// The batch row's position ids of a packed attention node: the forward's input 1, the backward's
// input 4; null without them.
inline const int32_t* document_positions(const Node& node, const KernelContext& ctx, int64_t b) {
  const size_t index = node.inputs.size() == 2 ? 1 : node.inputs.size() == 5 ? 4 : 0;
  if (index == 0) return nullptr;
  return ctx.i32(node.inputs[index]) + b * ctx.shape(node.inputs[index])[1];
}

// Packed documents: a query at t sees keys [t - positions[t], t] only (positions: each token's
// position within its document, for the batch row). Sets a block's scores of keys before that to
// `value`: -inf before the softmax (so they change neither a row's max nor, at exp's floor, its
// sum), then 0 in the probabilities, which the products with V and the gradients then ignore.
inline void hide_earlier_documents(float* s, int64_t m, int64_t n, int64_t t0, const int32_t* positions, float value) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t start = std::min(n, t0 + i - int64_t(positions[t0 + i]));
    std::fill_n(s + i * n, std::max<int64_t>(start, 0), value);
  }
}

// x[0, n) rounded to the 16-bit `type` and widened back, in place: what a 16-bit product reads of
// an fp32 tile. Both 16-bit paths round P and dS so, with or without a 16-bit matmul, so that a
// recipe computes the same products on every machine (only the GEMMs' summation orders differ).
inline void round_through(float* x, int64_t n, DType type) {
  uint16_t rounded[1024];
  for (int64_t begin = 0; begin < n; begin += 1024) {
    const int64_t count = std::min<int64_t>(1024, n - begin);
    narrow_serial(x + begin, rounded, type, count);
    widen_serial(rounded, type, x + begin, count);
  }
}

// Per-thread fp32 scratch, uninitialised (every tile is written before it is read).
inline std::unique_ptr<float[]> floats(int64_t n) {
  return std::unique_ptr<float[]>(new float[size_t(std::max<int64_t>(n, 1))]);
}

// The row loops of a block of m queries from t0, whose rows are n floats apart and whose row i
// sees keys [0, t0 + i]. The same bits on every ISA.
struct BlockLoops {
  // Scores to probabilities in place (zero above the diagonal); inv[i] = 1 / row sum, lse[i] = its
  // log-sum-exp.
  void (*softmax)(float* s, int64_t m, int64_t n, int64_t t0, float* inv, float* lse);
  // Scores to the forward's probabilities, exp(s - lse), from its saved log-sum-exp.
  void (*probabilities)(float* s, int64_t m, int64_t n, int64_t t0, const float* lse);
  // dP to dS in place: dS = P (dP - delta), delta = sum_s P dP per query (which is dO . out, summed
  // from fp32 P rather than read from the stored, in 16 bits rounded, out).
  void (*score_gradient)(const float* p, float* ds, int64_t m, int64_t n, int64_t t0);
};

// The loops at kernel_isa().
const BlockLoops& block_loops();

}  // namespace engine::ops::attention_detail
