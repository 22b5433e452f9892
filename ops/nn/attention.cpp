#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/convert.h"
#include "cuda_kernels.h"
#include "linalg/gemm.h"
#include "nn/attention16.h"
#include "nn/attention_blocks.h"
#include "nn/attention_cudnn.h"
#include "nn/qkv_layout.h"

namespace engine::ops {

namespace {

using namespace attention_detail;

// In 16-bit storage: 16-bit products where the CPU has a 16-bit matmul (nn/attention16.h), else
// fp32 GEMMs on tiles widened into per-thread fp32 scratch as a block needs them.
const char* const kTiles16 = "16-bit matmuls (oneDNN) with fp32 softmax, else fp32 GEMMs on tiles widened in cache";

// A tile of fp32 rows for the GEMMs: `ld` floats apart.
struct Rows {
  const float* data;
  int64_t ld;
};

// `width` columns from `column` of rows [first, first + count) of a value stored in any float type,
// rows `stride` elements apart: fp32 rows in place, 16-bit rows widened into `scratch`.
Rows rows(const void* data, DType type, int64_t stride, int64_t first, int64_t count, int64_t column, int64_t width,
          float* scratch) {
  if (type == DType::f32) return {static_cast<const float*>(data) + first * stride + column, stride};
  // Serially: these rows are 64 floats, less work than a parallel region's entry.
  for (int64_t r = 0; r < count; ++r)
    widen_serial(static_cast<const uint16_t*>(data) + (first + r) * stride + column, type, scratch + r * width, width);
  return {scratch, width};
}

// One task per (batch, head, query block), the latest (costliest) blocks handed out first so the
// cheap ones fill the threads' tails. Each task writes its own rows of out and lse.
void attention_cpu(const Node& node, const KernelContext& ctx) {
  if (attention16_applies(node, ctx)) return attention16_forward(node, ctx);
  const ValueId qkv_id = node.inputs[0], out_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const void* qkv = ctx.data(qkv_id);
  void* out = ctx.data(out_id);
  float* lse = ctx.f32(node.outputs[1]);
  const DType qkv_type = ctx.dtype(qkv_id), out_type = ctx.dtype(out_id);
  const bool rounds = attention16_types(node, ctx);  // P rounded as the 16-bit products would read it
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t T = d.time, hd = d.head_size, heads = d.batch * d.heads, tasks = heads * d.blocks();
  const BlockLoops& loops = block_loops();
#pragma omp parallel
  {
    auto scores = floats(kBlock * T), q_tile = floats(kBlock * hd), k_tile = floats(T * hd), v_tile = floats(T * hd);
    auto o_tile = floats(kBlock * hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t block = d.blocks() - 1 - task / heads, b = task % heads / d.heads, h = task % d.heads;
      const int64_t t0 = block * kBlock, m = std::min(kBlock, T - t0), n = t0 + m;  // queries [t0, n), keys [0, n)
      const int64_t first = b * T;                                                  // the batch's first row
      const Rows q = rows(qkv, qkv_type, d.row, first + t0, m, d.q(h), hd, q_tile.get());
      const Rows k = rows(qkv, qkv_type, d.row, first, n, d.k(h), hd, k_tile.get());
      const Rows v = rows(qkv, qkv_type, d.row, first, n, d.v(h), hd, v_tile.get());
      float* s = scores.get();
      sgemm('N', 'T', m, n, hd, scale, q.data, q.ld, k.data, k.ld, 0.0f, s, n);
      float inv[kBlock];
      const int32_t* positions = document_positions(node, ctx, b);
      if (positions) hide_earlier_documents(s, m, n, t0, positions, -INFINITY);
      loops.softmax(s, m, n, t0, inv, lse + (b * d.heads + h) * T + t0);
      if (positions) hide_earlier_documents(s, m, n, t0, positions, 0.0f);
      if (rounds) round_through(s, m * n, qkv_type);
      // O = P V, then each row divided by its sum.
      float* o = o_tile.get();
      int64_t ldo = hd;
      if (out_type == DType::f32) {
        o = ctx.f32(out_id) + (first + t0) * d.channels + h * hd;
        ldo = d.channels;
      }
      sgemm('N', 'N', m, hd, n, 1.0f, s, n, v.data, v.ld, 0.0f, o, ldo);
      for (int64_t i = 0; i < m; ++i) {
        float* row = o + i * ldo;
#pragma omp simd
        for (int64_t c = 0; c < hd; ++c) row[c] *= inv[i];
        if (out_type != DType::f32) store_row(row, out, out_type, (first + t0 + i) * d.channels + h * hd, hd, false);
      }
    }
  }
}

// inputs dout, qkv, out, lse; output dqkv (out is not read: delta comes from P and dP)
//
// One task per (batch, kv head): the query heads of a group add to the same dk and dv rows. A task
// runs its group's query heads and their blocks in order, summing dk and dv in fp32 tiles that it
// writes once at the end, so every sum has one order whatever the number of threads.
void attention_backward_cpu(const Node& node, const KernelContext& ctx) {
  if (attention16_applies(node, ctx)) return attention16_backward(node, ctx);
  const ValueId dout_id = node.inputs[0], qkv_id = node.inputs[1], dqkv_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const void* dout = ctx.data(dout_id);
  const void* qkv = ctx.data(qkv_id);
  const float* lse = ctx.f32(node.inputs[3]);
  void* dqkv = ctx.data(dqkv_id);
  const DType dout_type = ctx.dtype(dout_id), qkv_type = ctx.dtype(qkv_id), dqkv_type = ctx.dtype(dqkv_id);
  const bool rounds = attention16_types(node, ctx);  // P and dS rounded as the 16-bit products would read them
  const bool accumulate = ctx.accumulates(node, 0);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t T = d.time, hd = d.head_size, C = d.channels;
  const BlockLoops& loops = block_loops();
#pragma omp parallel
  {
    auto p_tile = floats(kBlock * T), ds_tile = floats(kBlock * T), k_tile = floats(T * hd), v_tile = floats(T * hd);
    auto dk = floats(T * hd), dv = floats(T * hd), q_tile = floats(kBlock * hd), do_tile = floats(kBlock * hd);
    auto dq_tile = floats(kBlock * hd), p_rounded = floats(rounds ? kBlock * T : 0);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t kh = 0; kh < d.kv_heads; ++kh) {
        const int64_t first = b * T, lead = kh * d.group();  // the batch's first row, the group's first head
        const Rows k = rows(qkv, qkv_type, d.row, first, T, d.k(lead), hd, k_tile.get());
        const Rows v = rows(qkv, qkv_type, d.row, first, T, d.v(lead), hd, v_tile.get());
        std::fill_n(dk.get(), T * hd, 0.0f);
        std::fill_n(dv.get(), T * hd, 0.0f);
        for (int64_t h = lead; h < lead + d.group(); ++h) {
          for (int64_t block = 0; block < d.blocks(); ++block) {
            const int64_t t0 = block * kBlock, m = std::min(kBlock, T - t0), n = t0 + m;
            const Rows q = rows(qkv, qkv_type, d.row, first + t0, m, d.q(h), hd, q_tile.get());
            const Rows dO = rows(dout, dout_type, C, first + t0, m, h * hd, hd, do_tile.get());
            // P = exp(Q K^T / sqrt(hd) - lse), zero above the diagonal.
            float* p = p_tile.get();
            float* ds = ds_tile.get();
            sgemm('N', 'T', m, n, hd, scale, q.data, q.ld, k.data, k.ld, 0.0f, p, n);
            const int32_t* positions = document_positions(node, ctx, b);
            if (positions) hide_earlier_documents(p, m, n, t0, positions, -INFINITY);
            loops.probabilities(p, m, n, t0, lse + (b * d.heads + h) * T + t0);
            if (positions) hide_earlier_documents(p, m, n, t0, positions, 0.0f);
            const float* p_product = p;  // what dV's product reads: P, or P rounded to 16 bits
            if (rounds) {
              std::copy_n(p, m * n, p_rounded.get());
              round_through(p_rounded.get(), m * n, qkv_type);
              p_product = p_rounded.get();
            }
            // dV += P^T dO;  dP = dO V^T;  dS = P (dP - delta).
            sgemm('T', 'N', n, hd, m, 1.0f, p_product, n, dO.data, dO.ld, 1.0f, dv.get(), hd);
            sgemm('N', 'T', m, n, hd, 1.0f, dO.data, dO.ld, v.data, v.ld, 0.0f, ds, n);
            loops.score_gradient(p, ds, m, n, t0);
            if (rounds) round_through(ds, m * n, qkv_type);
            // dK += dS^T Q / sqrt(hd);  dQ = dS K / sqrt(hd), written (or added) to its rows.
            sgemm('T', 'N', n, hd, m, scale, ds, n, q.data, q.ld, 1.0f, dk.get(), hd);
            if (dqkv_type == DType::f32) {
              float* dq = ctx.f32(dqkv_id) + (first + t0) * d.row + d.q(h);
              sgemm('N', 'N', m, hd, n, scale, ds, n, k.data, k.ld, accumulate ? 1.0f : 0.0f, dq, d.row);
            } else {
              float* dq = dq_tile.get();
              sgemm('N', 'N', m, hd, n, scale, ds, n, k.data, k.ld, 0.0f, dq, hd);
              for (int64_t i = 0; i < m; ++i)
                store_row(dq + i * hd, dqkv, dqkv_type, (first + t0 + i) * d.row + d.q(h), hd, accumulate);
            }
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          store_row(dk.get() + t * hd, dqkv, dqkv_type, (first + t) * d.row + d.k(lead), hd, accumulate);
          store_row(dv.get() + t * hd, dqkv, dqkv_type, (first + t) * d.row + d.v(lead), hd, accumulate);
        }
      }
    }
  }
}

void attention_grad(GradBuilder& gb, const Node& node) {
  ValueId dout = gb.grad(node.outputs[0]);
  if (dout == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  std::vector<ValueId> inputs{dout, node.inputs[0], node.outputs[0], node.outputs[1]};
  if (node.inputs.size() > 1) inputs.push_back(node.inputs[1]);  // packed documents' position ids
  gb.emit(kCausalAttentionBackward, inputs, {t.value}, t, node.attrs, node.name);
}

// Scores and weighted sum over the causal half, per query head: grouping saves memory, not FLOPs.
double attention_flops(const Shape& s, const Node& n, double per_entry) {
  Dims d = dims_of(s, n);
  return 2.0 * double(d.batch) * double(d.time) * double(d.time + 1) / 2 * double(d.channels) * per_entry;
}

}  // namespace

const OpDef kCausalAttention{
    .name = "causal_attention",
    .cpu = attention_cpu,
    .cuda = cuda_without_position_ids<cuda::attention, 1>,
    .grad = attention_grad,
    .flops = [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[0]).shape, n, 2); },
    .native_16bit = kTiles16,
    .fp32_outputs = 0b10,  // output 1: the log-sum-exp
    .cuda_16bit_for = cuda::cudnn_attention_supports,
    .cuda_workspace = cuda::cudnn_attention_workspace,
    .matmul = true};
const OpDef kCausalAttentionBackward{
    .name = "causal_attention_backward",
    .cpu = attention_backward_cpu,
    .cuda = cuda_without_position_ids<cuda::attention_backward, 4>,
    .flops = [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[1]).shape, n, 5); },
    .native_16bit = kTiles16,
    .cuda_16bit_for = cuda::cudnn_attention_supports,
    .cuda_workspace = cuda::cudnn_attention_workspace};

ValueId causal_attention(Graph& g, ValueId qkv, int64_t n_head, const std::string& name, int64_t kv_heads,
                         ValueId positions) {
  const Shape& s = g.value(qkv).shape;
  const QkvLayout layout = qkv_layout(s, n_head, kv_heads, name);
  kv_heads = layout.kv_heads;
  const int64_t c = layout.head_size * n_head;
  ValueId out = g.add_activation(name + ".out", Shape{s[0], s[1], c});
  ValueId lse = g.add_activation(name + ".lse", Shape{s[0], n_head, s[1]});
  std::vector<ValueId> inputs{qkv};
  if (positions != kNoValue) {
    if (g.value(positions).shape != Shape{s[0], s[1]} || g.value(positions).dtype != DType::i32)
      shape_error(name, "position ids must be (B, T) int32");
    inputs.push_back(positions);
  }
  g.add_node(Node{&kCausalAttention, inputs, {out, lse}, Attrs{{n_head, kv_heads}, {}}, false, false, name});
  return out;
}

int allow_unordered_attention_sums(Graph& g) {
  int marked = 0;
  for (Node& node : g.mutable_nodes()) {
    if (node.op != &kCausalAttentionBackward || !cuda::cudnn_attention_supports(g, node)) continue;
    node.attrs.ints.resize(3);
    node.attrs.ints[2] = 1;
    ++marked;
  }
  return marked;
}

bool attention_sums_unordered(const Node& node) { return node.attrs.ints.size() > 2 && node.attrs.ints[2] != 0; }

}  // namespace engine::ops
