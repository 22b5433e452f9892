#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/convert.h"
#include "linalg/gemm.h"
#include "nn/fast_math.h"
#include "nn/qkv_layout.h"

namespace engine::ops {

namespace {

// Both kernels work on blocks of kBlock queries: the block's scores against every key it sees
// (S = Q K^T over keys [0, last query], the keys above the diagonal never computed), the causal
// softmax of those rows, and the products with V (and, backward, with dO, K and Q) as GEMMs.
// 64 rows keep a block's scores (64 x T floats) and its q, k, v tiles in L2 at T = 1024.
constexpr int64_t kBlock = 64;

// Stored in the 16-bit types, values are widened into per-thread fp32 tiles as a block needs them.
const char* const kWidenedTiles16 = "fp32 GEMMs on 16-bit tiles widened in cache";

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

Dims dims_of(const Shape& s, const Node& node) {
  int64_t h = node.attrs.ints[0], kv = node.attrs.ints[1], hd = s[2] / (h + 2 * kv);
  return {s[0], s[1], h * hd, h, kv, hd, kv * hd, s[2]};
}

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

// Per-thread fp32 scratch, uninitialised (every tile is written before it is read).
std::unique_ptr<float[]> floats(int64_t n) {
  return std::unique_ptr<float[]>(new float[size_t(std::max<int64_t>(n, 1))]);
}

// One task per (batch, head, query block), the latest (costliest) blocks handed out first so the
// cheap ones fill the threads' tails. Each task writes its own rows of out and lse.
void attention_cpu(const Node& node, const KernelContext& ctx) {
  const ValueId qkv_id = node.inputs[0], out_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const void* qkv = ctx.data(qkv_id);
  void* out = ctx.data(out_id);
  float* lse = ctx.f32(node.outputs[1]);
  const DType qkv_type = ctx.dtype(qkv_id), out_type = ctx.dtype(out_id);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t T = d.time, hd = d.head_size, heads = d.batch * d.heads, tasks = heads * d.blocks();
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
      for (int64_t i = 0; i < m; ++i) {
        float* p = s + i * n;
        const int64_t seen = t0 + i + 1;  // keys 0..t
        float max_score = -INFINITY;
#pragma omp simd reduction(max : max_score)
        for (int64_t j = 0; j < seen; ++j) max_score = std::max(max_score, p[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < seen; ++j) {
          p[j] = fast_exp(p[j] - max_score);
          sum += p[j];
        }
        std::fill(p + seen, p + n, 0.0f);
        inv[i] = 1.0f / sum;
        lse[(b * d.heads + h) * T + t0 + i] = max_score + std::log(sum);
      }
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
  const ValueId dout_id = node.inputs[0], qkv_id = node.inputs[1], dqkv_id = node.outputs[0];
  const Dims d = dims_of(ctx.shape(qkv_id), node);
  const void* dout = ctx.data(dout_id);
  const void* qkv = ctx.data(qkv_id);
  const float* lse = ctx.f32(node.inputs[3]);
  void* dqkv = ctx.data(dqkv_id);
  const DType dout_type = ctx.dtype(dout_id), qkv_type = ctx.dtype(qkv_id), dqkv_type = ctx.dtype(dqkv_id);
  const bool accumulate = ctx.accumulates(node, 0);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t T = d.time, hd = d.head_size, C = d.channels;
#pragma omp parallel
  {
    auto p_tile = floats(kBlock * T), ds_tile = floats(kBlock * T), k_tile = floats(T * hd), v_tile = floats(T * hd);
    auto dk = floats(T * hd), dv = floats(T * hd), q_tile = floats(kBlock * hd), do_tile = floats(kBlock * hd);
    auto dq_tile = floats(kBlock * hd);
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
            const float* l = lse + (b * d.heads + h) * T + t0;
            for (int64_t i = 0; i < m; ++i) {
              float* row = p + i * n;
              const int64_t seen = t0 + i + 1;
#pragma omp simd
              for (int64_t j = 0; j < seen; ++j) row[j] = fast_exp(row[j] - l[i]);
              std::fill(row + seen, row + n, 0.0f);
            }
            // dV += P^T dO;  dP = dO V^T;  dS = P (dP - delta) with delta = dO . out = sum_s P dP per
            // query, summed here from fp32 P rather than read from the stored (in 16 bits, rounded) out.
            sgemm('T', 'N', n, hd, m, 1.0f, p, n, dO.data, dO.ld, 1.0f, dv.get(), hd);
            sgemm('N', 'T', m, n, hd, 1.0f, dO.data, dO.ld, v.data, v.ld, 0.0f, ds, n);
            for (int64_t i = 0; i < m; ++i) {
              const float* pr = p + i * n;
              float* dr = ds + i * n;
              const int64_t seen = t0 + i + 1;
              float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
              for (int64_t j = 0; j < seen; ++j) delta += pr[j] * dr[j];
#pragma omp simd
              for (int64_t j = 0; j < seen; ++j) dr[j] = pr[j] * (dr[j] - delta);
              std::fill(dr + seen, dr + n, 0.0f);
            }
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
  gb.emit(kCausalAttentionBackward, {dout, node.inputs[0], node.outputs[0], node.outputs[1]}, {t.value}, t, node.attrs,
          node.name);
}

// Scores and weighted sum over the causal half, per query head: grouping saves memory, not FLOPs.
double attention_flops(const Shape& s, const Node& n, double per_entry) {
  Dims d = dims_of(s, n);
  return 2.0 * double(d.batch) * double(d.time) * double(d.time + 1) / 2 * double(d.channels) * per_entry;
}

}  // namespace

const OpDef kCausalAttention{
    "causal_attention", attention_cpu,
    attention_grad,     [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[0]).shape, n, 2); },
    kWidenedTiles16,    0b10};  // the log-sum-exp in fp32
const OpDef kCausalAttentionBackward{
    "causal_attention_backward", attention_backward_cpu, nullptr,
    [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[1]).shape, n, 5); }, kWidenedTiles16};

ValueId causal_attention(Graph& g, ValueId qkv, int64_t n_head, const std::string& name, int64_t kv_heads) {
  const Shape& s = g.value(qkv).shape;
  const QkvLayout layout = qkv_layout(s, n_head, kv_heads, name);
  kv_heads = layout.kv_heads;
  const int64_t c = layout.head_size * n_head;
  ValueId out = g.add_activation(name + ".out", Shape{s[0], s[1], c});
  ValueId lse = g.add_activation(name + ".lse", Shape{s[0], n_head, s[1]});
  g.add_node(Node{&kCausalAttention, {qkv}, {out, lse}, Attrs{{n_head, kv_heads}, {}}, false, false, name});
  return out;
}

}  // namespace engine::ops
