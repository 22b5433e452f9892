#include "nn/attention.h"

#include "nn/fast_math.h"
#include "nn/qkv_layout.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace engine::ops {

namespace {

// channels: the width of q and of the output (H hd); kv_channels: the width of k and of v (KV hd).
struct Dims {
  int64_t batch, time, channels, heads, kv_heads, head_size, kv_channels, row;
  int64_t group() const { return heads / kv_heads; }
  // Offsets in a row of qkv of query head h, and of the key and value heads it reads.
  int64_t q(int64_t h) const { return h * head_size; }
  int64_t k(int64_t h) const { return channels + (h / group()) * head_size; }
  int64_t v(int64_t h) const { return channels + kv_channels + (h / group()) * head_size; }
};

Dims dims_of(const Shape& s, const Node& node) {
  int64_t h = node.attrs.ints[0], kv = node.attrs.ints[1], hd = s[2] / (h + 2 * kv);
  return {s[0], s[1], h * hd, h, kv, hd, kv * hd, s[2]};
}
Dims dims_of(const KernelContext& ctx, ValueId qkv, const Node& node) { return dims_of(ctx.shape(qkv), node); }

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void attention_cpu(const Node& node, const KernelContext& ctx) {
  Dims d = dims_of(ctx, node.inputs[0], node);
  const float* qkv = ctx.f32(node.inputs[0]);
  float* out = ctx.f32(node.outputs[0]);
  float* lse = ctx.f32(node.outputs[1]);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t row = d.row;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(d.time));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        const float* base = qkv + b * d.time * row;
        const int64_t k_at = d.k(h), v_at = d.v(h);
        for (int64_t t = 0; t < d.time; ++t) {
          const float* q = base + t * row + d.q(h);
          float max_score = -INFINITY;
          for (int64_t s = 0; s <= t; ++s) {
            scores[size_t(s)] = dot(q, base + s * row + k_at, d.head_size) * scale;
            max_score = std::max(max_score, scores[size_t(s)]);
          }
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t s = 0; s <= t; ++s) {
            scores[size_t(s)] = fast_exp(scores[size_t(s)] - max_score);
            sum += scores[size_t(s)];
          }
          float* o = out + (b * d.time + t) * d.channels + h * d.head_size;
          std::fill(o, o + d.head_size, 0.0f);
          float inv = 1.0f / sum;
          for (int64_t s = 0; s <= t; ++s) {
            const float* v = base + s * row + v_at;
            float p = scores[size_t(s)] * inv;
#pragma omp simd
            for (int64_t i = 0; i < d.head_size; ++i) o[i] += p * v[i];
          }
          lse[(b * d.heads + h) * d.time + t] = max_score + std::log(sum);
        }
      }
    }
  }
}

// inputs dout, qkv, out, lse; output dqkv
void attention_backward_cpu(const Node& node, const KernelContext& ctx) {
  Dims d = dims_of(ctx, node.inputs[1], node);
  const float* dout = ctx.f32(node.inputs[0]);
  const float* qkv = ctx.f32(node.inputs[1]);
  const float* out = ctx.f32(node.inputs[2]);
  const float* lse = ctx.f32(node.inputs[3]);
  float* dqkv = ctx.f32(node.outputs[0]);
  const bool accumulate = ctx.accumulates(node, 0);
  const float scale = 1.0f / std::sqrt(float(d.head_size));
  const int64_t row = d.row;
  // One task per (batch, kv head): the query heads of a group write the same dk and dv rows.
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t kh = 0; kh < d.kv_heads; ++kh) {
      const float* base = qkv + b * d.time * row;
      float* dbase = dqkv + b * d.time * row;
      const int64_t first = kh * d.group();
      if (!accumulate) {
        for (int64_t t = 0; t < d.time; ++t) {
          for (int64_t h = first; h < first + d.group(); ++h) std::fill_n(dbase + t * row + d.q(h), d.head_size, 0.0f);
          std::fill_n(dbase + t * row + d.k(first), d.head_size, 0.0f);
          std::fill_n(dbase + t * row + d.v(first), d.head_size, 0.0f);
        }
      }
      const int64_t k_at = d.k(first), v_at = d.v(first);
      for (int64_t h = first; h < first + d.group(); ++h) {
        for (int64_t t = 0; t < d.time; ++t) {
          const float* q = base + t * row + d.q(h);
          const float* dot_ = dout + (b * d.time + t) * d.channels + h * d.head_size;
          const float* o = out + (b * d.time + t) * d.channels + h * d.head_size;
          float delta = dot(dot_, o, d.head_size);
          float l = lse[(b * d.heads + h) * d.time + t];
          float* dq = dbase + t * row + d.q(h);
          for (int64_t s = 0; s <= t; ++s) {
            const float* k = base + s * row + k_at;
            const float* v = base + s * row + v_at;
            float p = fast_exp(dot(q, k, d.head_size) * scale - l);
            float ds = p * (dot(dot_, v, d.head_size) - delta) * scale;
            float* dk = dbase + s * row + k_at;
            float* dv = dbase + s * row + v_at;
#pragma omp simd
            for (int64_t i = 0; i < d.head_size; ++i) {
              dq[i] += ds * k[i];
              dk[i] += ds * q[i];
              dv[i] += p * dot_[i];
            }
          }
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
    "causal_attention",
    attention_cpu,
    attention_grad,
    [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[0]).shape, n, 2); },
    nullptr,
    0b10};  // the log-sum-exp in fp32
const OpDef kCausalAttentionBackward{
    "causal_attention_backward", attention_backward_cpu, nullptr,
    [](const Graph& g, const Node& n) { return attention_flops(g.value(n.inputs[1]).shape, n, 5); }};

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
