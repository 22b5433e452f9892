#include "nn/attention.h"

#include "nn/fast_math.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace engine::ops {

namespace {

struct Dims {
  int64_t batch, time, channels, heads, head_size;
};

Dims dims_of(const KernelContext& ctx, ValueId qkv, const Node& node) {
  const Shape& s = ctx.shape(qkv);
  int64_t c = s[2] / 3, h = node.attrs.ints[0];
  return {s[0], s[1], c, h, c / h};
}

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
  const int64_t row = 3 * d.channels;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(d.time));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        const float* base = qkv + b * d.time * row + h * d.head_size;
        for (int64_t t = 0; t < d.time; ++t) {
          const float* q = base + t * row;
          float max_score = -INFINITY;
          for (int64_t s = 0; s <= t; ++s) {
            scores[size_t(s)] = dot(q, base + s * row + d.channels, d.head_size) * scale;
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
            const float* v = base + s * row + 2 * d.channels;
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
  const int64_t row = 3 * d.channels;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* base = qkv + b * d.time * row + h * d.head_size;
      float* dbase = dqkv + b * d.time * row + h * d.head_size;
      if (!accumulate) {
        for (int64_t t = 0; t < d.time; ++t)
          for (int part = 0; part < 3; ++part) std::fill_n(dbase + t * row + part * d.channels, d.head_size, 0.0f);
      }
      for (int64_t t = 0; t < d.time; ++t) {
        const float* q = base + t * row;
        const float* dot_ = dout + (b * d.time + t) * d.channels + h * d.head_size;
        const float* o = out + (b * d.time + t) * d.channels + h * d.head_size;
        float delta = dot(dot_, o, d.head_size);
        float l = lse[(b * d.heads + h) * d.time + t];
        float* dq = dbase + t * row;
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = base + s * row + d.channels;
          const float* v = base + s * row + 2 * d.channels;
          float p = fast_exp(dot(q, k, d.head_size) * scale - l);
          float ds = p * (dot(dot_, v, d.head_size) - delta) * scale;
          float* dk = dbase + s * row + d.channels;
          float* dv = dbase + s * row + 2 * d.channels;
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

void attention_grad(GradBuilder& gb, const Node& node) {
  ValueId dout = gb.grad(node.outputs[0]);
  if (dout == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kCausalAttentionBackward, {dout, node.inputs[0], node.outputs[0], node.outputs[1]}, {t.value}, t, node.attrs,
          node.name);
}

double attention_flops(const Graph& g, const Node& n) {
  const Shape& s = g.value(n.inputs[0]).shape;
  double b = double(s[0]), t = double(s[1]), c = double(s[2]) / 3;
  return 2.0 * b * t * (t + 1) / 2 * c * 2;  // scores and weighted sum, causal half
}

}  // namespace

const OpDef kCausalAttention{"causal_attention", attention_cpu, attention_grad, attention_flops, nullptr,
                             0b10};  // the log-sum-exp in fp32
const OpDef kCausalAttentionBackward{"causal_attention_backward", attention_backward_cpu, nullptr,
                                     [](const Graph& g, const Node& n) {
                                       const Shape& s = g.value(n.inputs[1]).shape;
                                       double b = double(s[0]), t = double(s[1]), c = double(s[2]) / 3;
                                       return 2.0 * b * t * (t + 1) / 2 * c * 5;
                                     }};

ValueId causal_attention(Graph& g, ValueId qkv, int64_t n_head, const std::string& name) {
  const Shape& s = g.value(qkv).shape;
  if (s.rank() != 3 || s[2] % 3 != 0) shape_error(name, "qkv must be (B, T, 3C), got " + s.str());
  int64_t c = s[2] / 3;
  if (n_head < 1 || c % n_head != 0)
    shape_error(name, std::to_string(n_head) + " heads do not divide width " + std::to_string(c));
  ValueId out = g.add_activation(name + ".out", Shape{s[0], s[1], c});
  ValueId lse = g.add_activation(name + ".lse", Shape{s[0], n_head, s[1]});
  g.add_node(Node{&kCausalAttention, {qkv}, {out, lse}, Attrs{{n_head}, {}}, false, false, name});
  return out;
}

}  // namespace engine::ops
