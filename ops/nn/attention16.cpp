#include "nn/attention16.h"

#include <cmath>

#include "linalg/gemm16.h"
#include "nn/attention_blocks.h"

namespace engine::ops {

using namespace attention_detail;

bool attention16_types(const Node& node, const KernelContext& ctx) {
  const DType type = ctx.dtype(node.inputs[0]);
  if (type == DType::f32) return false;
  for (ValueId id : node.inputs)  // (packed documents' position ids are i32)
    if (ctx.dtype(id) != type && ctx.dtype(id) != DType::f32 && ctx.dtype(id) != DType::i32) return false;
  const bool forward = node.outputs.size() == 2;  // out and lse; the backward writes dqkv alone
  // Forward: qkv and out; backward: dout, qkv and dqkv, all of the one 16-bit type (lse is fp32).
  return forward ? ctx.dtype(node.outputs[0]) == type
                 : ctx.dtype(node.inputs[1]) == type && ctx.dtype(node.outputs[0]) == type;
}

namespace {
bool enabled = true;
}  // namespace

void set_attention16_enabled(bool on) { enabled = on; }

bool attention16_applies(const Node& node, const KernelContext& ctx) {
  return enabled && attention16_types(node, ctx) && matmul_16bit_available(ctx.dtype(node.inputs[0]));
}

namespace {

// s (m x n, fp32) = Q K^T / sqrt(hd) for m queries against n keys, both read in the packed qkv rows:
// the scores of the forward, and the backward's recomputed ones.
void scores16(const Dims& d, DType type, int64_t m, int64_t n, const uint16_t* q, const uint16_t* k, float* s) {
  gemm16({.transb = true,
          .m = m,
          .n = n,
          .k = d.head_size,
          .lda = d.row,
          .ldb = d.row,
          .ldc = n,
          .operands = type,
          .result = DType::f32,
          .scale = 1.0f / std::sqrt(float(d.head_size))},
         q, k, nullptr, s);
}

}  // namespace

// One task per (batch, head, query block), the latest (costliest) blocks first, as in the fp32
// kernel. S = Q K^T / sqrt(hd) and O = P V are 16-bit products; O is divided by the row sums and
// rounded once.
void attention16_forward(const Node& node, const KernelContext& ctx) {
  const ValueId qkv_id = node.inputs[0], out_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const auto* qkv = static_cast<const uint16_t*>(ctx.data(qkv_id));
  void* out = ctx.data(out_id);
  float* lse = ctx.f32(node.outputs[1]);
  const DType type = ctx.dtype(qkv_id);
  const int64_t T = d.time, hd = d.head_size, heads = d.batch * d.heads, tasks = heads * d.blocks();
  const BlockLoops& loops = block_loops();
#pragma omp parallel
  {
    auto scores = floats(kBlock * T), o_tile = floats(kBlock * hd);
    std::unique_ptr<uint16_t[]> p16(new uint16_t[size_t(kBlock * T)]);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t block = d.blocks() - 1 - task / heads, b = task % heads / d.heads, h = task % d.heads;
      const int64_t t0 = block * kBlock, m = std::min(kBlock, T - t0), n = t0 + m;  // queries [t0, n), keys [0, n)
      const uint16_t* q = qkv + (b * T + t0) * d.row + d.q(h);
      const uint16_t* k = qkv + b * T * d.row + d.k(h);
      const uint16_t* v = qkv + b * T * d.row + d.v(h);
      float* s = scores.get();
      scores16(d, type, m, n, q, k, s);
      float inv[kBlock];
      const int32_t* positions = document_positions(node, ctx, b);
      if (positions) hide_earlier_documents(s, m, n, t0, positions, -INFINITY);
      loops.softmax(s, m, n, t0, inv, lse + (b * d.heads + h) * T + t0);
      if (positions) hide_earlier_documents(s, m, n, t0, positions, 0.0f);
      narrow_serial(s, p16.get(), type, m * n);
      float* o = o_tile.get();
      gemm16({.m = m, .n = hd, .k = n, .lda = n, .ldb = d.row, .ldc = hd, .operands = type, .result = DType::f32},
             p16.get(), v, nullptr, o);
      for (int64_t i = 0; i < m; ++i) {
        float* row = o + i * hd;
#pragma omp simd
        for (int64_t c = 0; c < hd; ++c) row[c] *= inv[i];
        store_row(row, out, type, (b * T + t0 + i) * d.channels + h * hd, hd, false);
      }
    }
  }
}

// One task per (batch, kv head), its group's query heads and their blocks in order, dK and dV
// summed in fp32 tiles written once at the end: the fp32 kernel's order, so the same bits on any
// number of threads. P and dS / sqrt(hd) are rounded to the 16-bit type for the products that read
// them; dS's fp32 values come from fp32 P and dP.
void attention16_backward(const Node& node, const KernelContext& ctx) {
  const ValueId dout_id = node.inputs[0], qkv_id = node.inputs[1], dqkv_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const auto* dout = static_cast<const uint16_t*>(ctx.data(dout_id));
  const auto* qkv = static_cast<const uint16_t*>(ctx.data(qkv_id));
  const float* lse = ctx.f32(node.inputs[3]);
  void* dqkv = ctx.data(dqkv_id);
  const DType type = ctx.dtype(qkv_id);
  const bool accumulate = ctx.accumulates(node, 0);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t T = d.time, hd = d.head_size, C = d.channels;
  const BlockLoops& loops = block_loops();
#pragma omp parallel
  {
    auto p_tile = floats(kBlock * T), ds_tile = floats(kBlock * T);
    auto dk = floats(T * hd), dv = floats(T * hd), dq = floats(kBlock * hd);
    std::unique_ptr<uint16_t[]> p16(new uint16_t[size_t(kBlock * T)]), ds16(new uint16_t[size_t(kBlock * T)]);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t kh = 0; kh < d.kv_heads; ++kh) {
        const int64_t first = b * T, lead = kh * d.group();  // the batch's first row, the group's first head
        const uint16_t* k = qkv + first * d.row + d.k(lead);
        const uint16_t* v = qkv + first * d.row + d.v(lead);
        std::fill_n(dk.get(), T * hd, 0.0f);
        std::fill_n(dv.get(), T * hd, 0.0f);
        for (int64_t h = lead; h < lead + d.group(); ++h) {
          for (int64_t block = 0; block < d.blocks(); ++block) {
            const int64_t t0 = block * kBlock, m = std::min(kBlock, T - t0), n = t0 + m;
            const uint16_t* q = qkv + (first + t0) * d.row + d.q(h);
            const uint16_t* dO = dout + (first + t0) * C + h * hd;
            float* p = p_tile.get();
            float* ds = ds_tile.get();
            // P = exp(Q K^T / sqrt(hd) - lse), zero above the diagonal.
            scores16(d, type, m, n, q, k, p);
            const int32_t* positions = document_positions(node, ctx, b);
            if (positions) hide_earlier_documents(p, m, n, t0, positions, -INFINITY);
            loops.probabilities(p, m, n, t0, lse + (b * d.heads + h) * T + t0);
            if (positions) hide_earlier_documents(p, m, n, t0, positions, 0.0f);
            narrow_serial(p, p16.get(), type, m * n);
            // dV += P^T dO;  dP = dO V^T;  dS = P (dP - delta).
            gemm16({.transa = true,
                    .m = n,
                    .n = hd,
                    .k = m,
                    .lda = n,
                    .ldb = C,
                    .ldc = hd,
                    .operands = type,
                    .result = DType::f32,
                    .accumulate = true},
                   p16.get(), dO, nullptr, dv.get());
            gemm16({.transb = true,
                    .m = m,
                    .n = n,
                    .k = hd,
                    .lda = C,
                    .ldb = d.row,
                    .ldc = n,
                    .operands = type,
                    .result = DType::f32},
                   dO, v, nullptr, ds);
            loops.score_gradient(p, ds, m, n, t0);
            narrow_serial(ds, ds16.get(), type, m * n);
            // dK += dS^T Q / sqrt(hd);  dQ = dS K / sqrt(hd), written (or added) to its rows.
            gemm16({.transa = true,
                    .m = n,
                    .n = hd,
                    .k = m,
                    .lda = n,
                    .ldb = d.row,
                    .ldc = hd,
                    .operands = type,
                    .result = DType::f32,
                    .accumulate = true,
                    .scale = scale},
                   ds16.get(), q, nullptr, dk.get());
            gemm16({.m = m,
                    .n = hd,
                    .k = n,
                    .lda = n,
                    .ldb = d.row,
                    .ldc = hd,
                    .operands = type,
                    .result = DType::f32,
                    .scale = scale},
                   ds16.get(), k, nullptr, dq.get());
            for (int64_t i = 0; i < m; ++i)
              store_row(dq.get() + i * hd, dqkv, type, (first + t0 + i) * d.row + d.q(h), hd, accumulate);
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          store_row(dk.get() + t * hd, dqkv, type, (first + t) * d.row + d.k(lead), hd, accumulate);
          store_row(dv.get() + t * hd, dqkv, type, (first + t) * d.row + d.v(lead), hd, accumulate);
        }
      }
    }
  }
}

}  // namespace engine::ops
