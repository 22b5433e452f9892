// The op harness's cases (every op with its double-precision reference) and its fp32 suite: see
// op_harness.h. The same cases in bf16 and fp16 storage are in op_harness_16bit_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "core/convert.h"
#include "core/error.h"
#include "elementwise/add.h"
#include "elementwise/cast.h"
#include "graph/recompute.h"
#include "linalg/linear.h"
#include "linalg/linear_gelu.h"
#include "linalg/matmul.h"
#include "loss/cross_entropy.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/rotary.h"
#include "nn/softmax.h"
#include "op_harness.h"
#include "reduce/sum.h"
#include "runtime/executor.h"
#include "shape/columns.h"
#include "shape/transpose.h"

namespace engine::op_harness {
namespace {

// ---- double-precision references ----

Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor* b, int64_t rows, int64_t k, int64_t m) {
  Tensor y(size_t(rows * m));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < m; ++j) {
      double s = b ? (*b)[size_t(j)] : 0;
      for (int64_t i = 0; i < k; ++i) s += x[size_t(r * k + i)] * w[size_t(j * k + i)];
      y[size_t(r * m + j)] = s;
    }
  return y;
}

Tensor ref_norm(const Tensor& x, const Tensor& w, const Tensor* b, int64_t rows, int64_t c, bool rms, double eps) {
  Tensor y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t i = 0; i < c; ++i) mean += x[size_t(r * c + i)];
      mean /= double(c);
    }
    for (int64_t i = 0; i < c; ++i) var += std::pow(x[size_t(r * c + i)] - mean, 2);
    var /= double(c);
    double rstd = 1 / std::sqrt(var + eps);
    for (int64_t i = 0; i < c; ++i)
      y[size_t(r * c + i)] = (x[size_t(r * c + i)] - mean) * rstd * w[size_t(i)] + (b ? (*b)[size_t(i)] : 0);
  }
  return y;
}

template <class F>
Tensor ref_map(const Tensor& x, F f) {
  Tensor y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  return y;
}

double gelu_d(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu_d(double x) { return x / (1 + std::exp(-x)); }

// qkv rows are [q (H heads) | k (KV heads) | v (KV heads)]; query head h reads kv head h / (H / KV).
Tensor ref_attention(const Tensor& qkv, int64_t B, int64_t T, int64_t C, int64_t H, int64_t KV) {
  const int64_t hd = C / H, row = C + 2 * KV * hd;
  Tensor out(size_t(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t k_at = C + (h / (H / KV)) * hd, v_at = k_at + KV * hd;
        std::vector<double> s(size_t(t + 1));
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += qkv[size_t((b * T + t) * row + h * hd + i)] * qkv[size_t((b * T + u) * row + k_at + i)];
          s[size_t(u)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(u)]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < hd; ++i)
            out[size_t((b * T + t) * C + h * hd + i)] += s[size_t(u)] / z * qkv[size_t((b * T + u) * row + v_at + i)];
      }
  return out;
}

// The rotation itself, at the frequencies nn/rotary_math.h gives (checked against transformers'
// by tests/hf/hf_test.cpp).
Tensor ref_rotary(const Tensor& qkv, int64_t B, int64_t T, int64_t C, int64_t H, int64_t KV,
                  const ops::RopeFrequencies& frequencies) {
  const int64_t hd = C / H, half = hd / 2, row = C + 2 * KV * hd;
  Tensor y = qkv;
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H + KV; ++h)  // the q heads, then the k heads
      for (int64_t i = 0; i < half; ++i) {
        double angle = double(bt % T) * ops::rope_inverse_frequency(frequencies, i, hd);
        size_t a = size_t(bt * row + h * hd + i), b = a + size_t(half);
        y[a] = qkv[a] * std::cos(angle) - qkv[b] * std::sin(angle);
        y[b] = qkv[a] * std::sin(angle) + qkv[b] * std::cos(angle);
      }
  return y;
}

// Llama 3.1's rescaling with a short original context, so that a head of 6 has a kept, an
// interpolated and a stretched frequency (wavelengths 6.3, 135 and 2918 against 64 and 256).
const ops::RopeFrequencies kLlama3Scaled{.theta = 10000.0,
                                         .scaling = ops::RopeScaling::llama3,
                                         .factor = 8.0,
                                         .low_freq_factor = 1.0,
                                         .high_freq_factor = 4.0,
                                         .original_context = 256.0};

}  // namespace

std::vector<Case> cases(std::mt19937& shape_rng) {
  auto pick = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(shape_rng)); };
  const int64_t rows = pick(1, 9), k = pick(1, 13), m = pick(1, 11), c = pick(2, 17);
  const int64_t B = pick(1, 3), T = pick(1, 7), H = pick(1, 3), hd = 2 * pick(1, 3), C = H * hd, V = pick(2, 13);
  // Grouped-query attention: KV key/value heads, each shared by `group` query heads.
  const int64_t KV = pick(1, 2), group = pick(2, 3), GH = KV * group, GC = GH * hd;
  // Attention over more than one block of queries (the kernels work on 64 at a time), the last one
  // partial, with grouped-query heads.
  const int64_t LT = 64 + pick(1, 60), LKV = pick(1, 2), LH = LKV * pick(1, 2), LC = LH * hd;
  std::vector<Case> all;
  all.push_back(
      {"linear+bias",
       {Shape{rows, k}, Shape{m, k}, Shape{m}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::linear(g, p[0], p[1], p[2], "linear"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_linear(x[0], x[1], &x[2], rows, k, m); }});
  // Wider than 128 columns, the last 16-column block partial.
  const int64_t wide = 2 * 64 + pick(1, 63);
  all.push_back(
      {"linear+bias (wide)",
       {Shape{rows, k}, Shape{wide, k}, Shape{wide}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::linear(g, p[0], p[1], p[2], "linear"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_linear(x[0], x[1], &x[2], rows, k, wide); },
       1e-4,
       // The input's gradient sums `wide` (129-191) products: 191 * 2^-24 = 1.1e-5 of (1 + |g|) by
       // the bound in op_harness.h (measured: 3.3e-6, fp32 seed 1).
       1.2e-5});
  all.push_back(
      {"linear (3-D input, no bias)",
       {Shape{2, rows, k}, Shape{m, k}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::linear(g, p[0], p[1], kNoValue, "linear"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_linear(x[0], x[1], nullptr, 2 * rows, k, m); }});
  all.push_back(
      {"layernorm",
       {Shape{rows, c}, Shape{c}, Shape{c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::layernorm(g, p[0], p[1], p[2], 1e-5, "ln"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_norm(x[0], x[1], &x[2], rows, c, false, 1e-5); }});
  all.push_back(
      {"layernorm without shift",
       {Shape{rows, c}, Shape{c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) {
         return ops::layernorm(g, p[0], p[1], kNoValue, 1e-5, "ln");
       },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_norm(x[0], x[1], nullptr, rows, c, false, 1e-5); }});
  // Rows the CUDA kernels read in 16-byte packs (a multiple of 8 columns), one to three packs a
  // lane, over more than one group of rows of the backward.
  const int64_t packed_rows = pick(9, 30), packed_c = 8 * pick(12, 40);
  all.push_back(
      {"layernorm (packed rows)",
       {Shape{packed_rows, packed_c}, Shape{packed_c}, Shape{packed_c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::layernorm(g, p[0], p[1], p[2], 1e-5, "ln"); },
       [=](const std::vector<Tensor>& x, const auto&) {
         return ref_norm(x[0], x[1], &x[2], packed_rows, packed_c, false, 1e-5);
       }});
  all.push_back(
      {"rmsnorm (packed rows)",
       {Shape{packed_rows, packed_c}, Shape{packed_c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rmsnorm(g, p[0], p[1], 1e-6, "rms"); },
       [=](const std::vector<Tensor>& x, const auto&) {
         return ref_norm(x[0], x[1], nullptr, packed_rows, packed_c, true, 1e-6);
       }});
  all.push_back(
      {"rmsnorm",
       {Shape{rows, c}, Shape{c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rmsnorm(g, p[0], p[1], 1e-6, "rms"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_norm(x[0], x[1], nullptr, rows, c, true, 1e-6); }});
  all.push_back({"gelu",
                 {Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::gelu(g, p[0], "gelu"); },
                 [](const std::vector<Tensor>& x, const auto&) { return ref_map(x[0], gelu_d); }});
  all.push_back({"relu",
                 {Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::relu(g, p[0], "relu"); },
                 [](const std::vector<Tensor>& x, const auto&) {
                   return ref_map(x[0], [](double v) { return v > 0 ? v : 0; });
                 }});
  all.push_back({"silu",
                 {Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::silu(g, p[0], "silu"); },
                 [](const std::vector<Tensor>& x, const auto&) { return ref_map(x[0], silu_d); }});
  all.push_back({"swiglu",
                 {Shape{rows, c}, Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::swiglu(g, p[0], p[1], "swiglu"); },
                 [](const std::vector<Tensor>& x, const auto&) {
                   Tensor y(x[0].size());
                   for (size_t i = 0; i < y.size(); ++i) y[i] = silu_d(x[0][i]) * x[1][i];
                   return y;
                 }});
  all.push_back({"add",
                 {Shape{rows, c}, Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::add(g, p[0], p[1], "add"); },
                 [](const std::vector<Tensor>& x, const auto&) {
                   Tensor y(x[0].size());
                   for (size_t i = 0; i < y.size(); ++i) y[i] = x[0][i] + x[1][i];
                   return y;
                 }});
  // The memory-bound kernels at a size past the serial limit (kSerialElements), so their parallel
  // paths, several 1024-element chunks with a partial last one, and (layernorm_backward) several
  // row blocks of the scale gradient with a partial last one all run; odd sizes leave vector tails.
  const int64_t wide_rows = 67, wide_c = 1031;
  all.push_back(
      {"layernorm (wide)",
       {Shape{wide_rows, wide_c}, Shape{wide_c}, Shape{wide_c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::layernorm(g, p[0], p[1], p[2], 1e-5, "ln"); },
       [=](const std::vector<Tensor>& x, const auto&) {
         return ref_norm(x[0], x[1], &x[2], wide_rows, wide_c, false, 1e-5);
       },
       1e-4,
       // The scale and shift gradients sum 67 rows of products: 67 * 2^-24 = 4e-6 of (1 + |g|) by
       // the bound in op_harness.h (measured: 2.4e-6, bf16 seed 6).
       8e-6});
  all.push_back({"gelu (wide)",
                 {Shape{wide_rows, wide_c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::gelu(g, p[0], "gelu"); },
                 [](const std::vector<Tensor>& x, const auto&) { return ref_map(x[0], gelu_d); }});
  all.push_back({"add (wide)",
                 {Shape{wide_rows, wide_c}, Shape{wide_rows, wide_c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::add(g, p[0], p[1], "add"); },
                 [](const std::vector<Tensor>& x, const auto&) {
                   Tensor y(x[0].size());
                   for (size_t i = 0; i < y.size(); ++i) y[i] = x[0][i] + x[1][i];
                   return y;
                 }});
  all.push_back(
      {"embedding with positions",
       {Shape{V, c}, Shape{T + 1, c}},
       Shape{B, T},
       V,
       [](Graph& g, const std::vector<ValueId>& p, ValueId t) { return ops::embedding(g, t, p[0], p[1], "emb"); },
       [=](const std::vector<Tensor>& x, const std::vector<int32_t>& tok) {
         Tensor y(size_t(B * T * c));
         for (int64_t bt = 0; bt < B * T; ++bt)
           for (int64_t i = 0; i < c; ++i)
             y[size_t(bt * c + i)] = x[0][size_t(tok[size_t(bt)] * c + i)] + x[1][size_t((bt % T) * c + i)];
         return y;
       }});
  all.push_back(
      {"causal_attention",
       {Shape{B, T, 3 * C}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::causal_attention(g, p[0], H, "attn"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_attention(x[0], B, T, C, H, H); }});
  all.push_back(
      {"causal_attention (grouped-query)",
       {Shape{B, T, GC + 2 * KV * hd}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::causal_attention(g, p[0], GH, "attn", KV); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_attention(x[0], B, T, GC, GH, KV); }});
  all.push_back({"causal_attention (grouped-query, over query blocks)",
                 {Shape{1, LT, LC + 2 * LKV * hd}},
                 {},
                 0,
                 [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                   return ops::causal_attention(g, p[0], LH, "attn", LKV);
                 },
                 [=](const std::vector<Tensor>& x, const auto&) { return ref_attention(x[0], 1, LT, LC, LH, LKV); }});
  // The same through a reshape: qkv is then an activation, so in 16-bit storage its gradient is
  // 16-bit too (a parameter's accumulates in fp32) and the kernel writes it in the stored type.
  all.push_back({"causal_attention of an activation",
                 {Shape{2 * LT, LC + 2 * LKV * hd}},
                 {},
                 0,
                 [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                   ValueId qkv = ops::reshape(g, p[0], Shape{2, LT, LC + 2 * LKV * hd}, "r");
                   return ops::causal_attention(g, qkv, LH, "attn", LKV);
                 },
                 [=](const std::vector<Tensor>& x, const auto&) { return ref_attention(x[0], 2, LT, LC, LH, LKV); }});
  all.push_back({"rotary",
                 {Shape{B, T, 3 * C}},
                 {},
                 0,
                 [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rotary(g, p[0], H, {}, "rope"); },
                 [=](const std::vector<Tensor>& x, const auto&) { return ref_rotary(x[0], B, T, C, H, H, {}); }});
  all.push_back(
      {"rotary (grouped-query, llama3 scaling)",
       {Shape{B, T, GC + 2 * KV * hd}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
         return ops::rotary(g, p[0], GH, kLlama3Scaled, "rope", KV);
       },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_rotary(x[0], B, T, GC, GH, KV, kLlama3Scaled); }});
  all.push_back({"softmax",
                 {Shape{rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::softmax(g, p[0], "softmax"); },
                 [=](const std::vector<Tensor>& x, const auto&) {
                   Tensor y(x[0].size());
                   for (int64_t r = 0; r < rows; ++r) {
                     double mx = -1e300, z = 0;
                     for (int64_t i = 0; i < c; ++i) mx = std::max(mx, x[0][size_t(r * c + i)]);
                     for (int64_t i = 0; i < c; ++i) z += std::exp(x[0][size_t(r * c + i)] - mx);
                     for (int64_t i = 0; i < c; ++i) y[size_t(r * c + i)] = std::exp(x[0][size_t(r * c + i)] - mx) / z;
                   }
                   return y;
                 }});
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t batch = B;
      Shape a_shape = ta ? Shape{batch, k, rows} : Shape{batch, rows, k};
      Shape b_shape = tb ? Shape{batch, m, k} : Shape{batch, k, m};
      all.push_back(
          {"matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
           {a_shape, b_shape},
           {},
           0,
           [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::matmul(g, p[0], p[1], ta, tb, "mm"); },
           [=](const std::vector<Tensor>& x, const auto&) {
             Tensor y(static_cast<size_t>(batch * rows * m), 0.0);
             for (int64_t b = 0; b < batch; ++b)
               for (int64_t i = 0; i < rows; ++i)
                 for (int64_t j = 0; j < m; ++j)
                   for (int64_t l = 0; l < k; ++l) {
                     double av =
                         ta ? x[0][size_t(b * k * rows + l * rows + i)] : x[0][size_t(b * rows * k + i * k + l)];
                     double bv = tb ? x[1][size_t(b * m * k + j * k + l)] : x[1][size_t(b * k * m + l * m + j)];
                     y[size_t(b * rows * m + i * m + j)] += av * bv;
                   }
             return y;
           }});
    }
  }
  all.push_back({"transpose",
                 {Shape{B, rows, c}},
                 {},
                 0,
                 [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::transpose(g, p[0], "t"); },
                 [=](const std::vector<Tensor>& x, const auto&) {
                   Tensor y(x[0].size());
                   for (int64_t b = 0; b < B; ++b)
                     for (int64_t i = 0; i < rows; ++i)
                       for (int64_t j = 0; j < c; ++j)
                         y[size_t(b * rows * c + j * rows + i)] = x[0][size_t(b * rows * c + i * c + j)];
                   return y;
                 }});
  {
    // A LoRA update on a column range of a wider output (Llama's k rows of qkv): the range ends
    // before the last column, so both edges are crossed.
    const int64_t width = std::max<int64_t>(1, c / 2), offset = (c - width) / 2;
    all.push_back({"add_columns",
                   {Shape{B, rows, c}, Shape{B, rows, width}},
                   {},
                   0,
                   [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                     return ops::add_columns(g, p[0], p[1], offset, 0.75, "ac");
                   },
                   [=](const std::vector<Tensor>& x, const auto&) {
                     Tensor y = x[0];
                     for (int64_t r = 0; r < B * rows; ++r)
                       for (int64_t j = 0; j < width; ++j)
                         y[size_t(r * c + offset + j)] += 0.75 * x[1][size_t(r * width + j)];
                     return y;
                   }});
    all.push_back({"take_columns",
                   {Shape{B, rows, c}},
                   {},
                   0,
                   [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                     return ops::take_columns(g, p[0], offset, width, -1.5, "tc");
                   },
                   [=](const std::vector<Tensor>& x, const auto&) {
                     Tensor y(size_t(B * rows * width));
                     for (int64_t r = 0; r < B * rows; ++r)
                       for (int64_t j = 0; j < width; ++j)
                         y[size_t(r * width + j)] = -1.5 * x[0][size_t(r * c + offset + j)];
                     return y;
                   }});
    all.back().differentiable = false;  // add_columns' gradient; its own is never needed
  }
  all.push_back(
      {"reshape",
       {Shape{rows, c}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::reshape(g, p[0], Shape{rows * c}, "r"); },
       [](const std::vector<Tensor>& x, const auto&) { return x[0]; }});
  for (bool mean : {false, true}) {
    all.push_back({mean ? "reduce_mean" : "reduce_sum",
                   {Shape{rows, c}},
                   {},
                   0,
                   [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                     return mean ? ops::reduce_mean(g, p[0], "mean") : ops::reduce_sum(g, p[0], "sum");
                   },
                   [=](const std::vector<Tensor>& x, const auto&) {
                     Tensor y(static_cast<size_t>(rows), 0.0);
                     for (int64_t r = 0; r < rows; ++r)
                       for (int64_t i = 0; i < c; ++i)
                         y[size_t(r)] += x[0][size_t(r * c + i)] / (mean ? double(c) : 1.0);
                     return y;
                   }});
  }
  {
    // Offload and prefetch (cpu_checkpointing): a value copied to host memory and back, unchanged.
    Case host_copy{"host_copy there and back",
                   {Shape{rows, c}},
                   {},
                   0,
                   [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
                     ValueId host = g.add_activation("x@host", Shape{rows, c});
                     g.mutable_value(host).placement = Placement::host;
                     ValueId back = g.add_activation("x@prefetched", Shape{rows, c});
                     g.add_node(Node{&kHostCopy, {p[0]}, {host}, {}, false, false, "offload"});
                     g.add_node(Node{&kHostCopy, {host}, {back}, {}, false, false, "prefetch"});
                     return back;
                   },
                   [](const std::vector<Tensor>& x, const auto&) { return x[0]; }};
    host_copy.forward_tolerance = 0;
    host_copy.differentiable = false;
    all.push_back(host_copy);
  }
  for (DType t : {DType::bf16, DType::f16}) {
    // f32 -> 16-bit -> f32: the forward rounds to nearest even; the gradient passes straight through.
    Case c16{std::string("cast round trip ") + std::string(dtype_name(t)),
             {Shape{rows, c}},
             {},
             0,
             [=](Graph& g, const std::vector<ValueId>& p, ValueId) {
               return ops::cast(g, ops::cast(g, p[0], t, "to16"), DType::f32, "to32");
             },
             [=](const std::vector<Tensor>& x, const auto&) {
               Tensor y(x[0].size());
               for (size_t i = 0; i < y.size(); ++i) {
                 auto f = float(x[0][i]);
                 y[i] = t == DType::bf16 ? bf16_to_float(float_to_bf16(f)) : f16_to_float(float_to_f16(f));
               }
               return y;
             }};
    c16.forward_tolerance = 0;
    c16.straight_through = true;
    all.push_back(c16);
  }
  // The kernel streams a row in chunks of 512 logits with a running max: a short row is one
  // chunk; a long one spans three, the last partial, and its max rises from chunk to chunk.
  // Packed rows: a multiple of 8 logits, more than one sweep of the 512 lanes' 16-byte packs.
  const int64_t long_rows = pick(4, 8), long_v = 2 * 512 + pick(1, 511), packed_v = 8 * pick(520, 700);
  for (const auto& shape : {std::tuple{"softmax_cross_entropy", rows, V},
                            std::tuple{"softmax_cross_entropy (long rows)", long_rows, long_v},
                            std::tuple{"softmax_cross_entropy (packed rows)", long_rows, packed_v}}) {
    // Named variables: the reference lambda captures them (clang cannot capture structured bindings).
    const char* name = std::get<0>(shape);
    const int64_t n = std::get<1>(shape), vocab = std::get<2>(shape);
    Case xent{name,
              {Shape{n, vocab}},
              Shape{n},
              vocab,
              [](Graph& g, const std::vector<ValueId>& p, ValueId t) {
                return ops::softmax_cross_entropy(g, p[0], t, 1.0, "xent");
              },
              [=](const std::vector<Tensor>& x, const std::vector<int32_t>& tok) {
                Tensor y(static_cast<size_t>(n));
                for (int64_t r = 0; r < n; ++r) {
                  double mx = -1e300, z = 0;
                  for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, x[0][size_t(r * vocab + v)]);
                  for (int64_t v = 0; v < vocab; ++v) z += std::exp(x[0][size_t(r * vocab + v)] - mx);
                  y[size_t(r)] = std::log(z) + mx - x[0][size_t(r * vocab + tok[size_t(r)])];
                }
                return y;
              }};
    xent.weighted = false;
    all.push_back(xent);
  }
  // A Llama's width (2048 columns): in bf16 and fp16 the CUDA norm backward's widest
  // register kernel (eight 16-byte packs a lane), which the narrower cases never reach.
  const int64_t llama_rows = pick(3, 9), llama_c = 2048;
  all.push_back(
      {"rmsnorm (2048 columns)",
       {Shape{llama_rows, llama_c}, Shape{llama_c}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rmsnorm(g, p[0], p[1], 1e-5, "rms"); },
       [=](const std::vector<Tensor>& x, const auto&) {
         return ref_norm(x[0], x[1], nullptr, llama_rows, llama_c, true, 1e-5);
       }});
  return all;
}

std::vector<Case> fusion_cases(std::mt19937& shape_rng) {
  auto pick = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(shape_rng)); };
  // GPT's MLP: out = gelu(x W1^T + b1) W2^T + b2, x (rows, k), W1 (m, k), W2 (n, m).
  auto mlp = [](std::string name, int64_t rows, int64_t k, int64_t m, int64_t n) {
    return Case{std::move(name),
                {Shape{rows, k}, Shape{m, k}, Shape{m}, Shape{n, m}, Shape{n}},
                {},
                0,
                [](Graph& g, const std::vector<ValueId>& p, ValueId) {
                  const ValueId f = ops::gelu(g, ops::linear(g, p[0], p[1], p[2], "mlp.c_fc"), "mlp.gelu");
                  return ops::linear(g, f, p[3], p[4], "mlp.c_proj");
                },
                [=](const std::vector<Tensor>& x, const auto&) {
                  const Tensor f = ref_map(ref_linear(x[0], x[1], &x[2], rows, k, m), gelu_d);
                  return ref_linear(f, x[3], &x[4], rows, m, n);
                },
                1e-4,
                // The fc bias's gradient sums the rows (up to 40) of the projection's input gradient,
                // each a sum of up to 32 products of O(1) values: their rounding errors, about 2e-6 a
                // row, add over the rows to about 1e-5 at the largest shapes, where the gradient
                // itself may be small (cancellation, which 1 + |g| does not see). Measured 1.8e-5 of
                // (1 + |g|) on one draw (the sanitizer build's: clang evaluates a call's picks in
                // another order than GCC, so its shapes differ); a wrong gradient is off by O(1).
                5e-5,
                true,
                false,
                true,
                // The fc product, GELU and the projection, each rounded (measured worst on an H100:
                // 0.017 of max |cpu| in bf16, 1.1 single-op bounds).
                3,
                2};
  };
  std::vector<Case> all;
  all.push_back(mlp("mlp: linear, gelu, linear (odd sizes)", pick(1, 9), pick(1, 13), pick(1, 11), pick(1, 7)));
  // Sizes cuBLASLt's GELU epilogues take: leading dimensions multiples of 8.
  all.push_back(
      mlp("mlp: linear, gelu, linear (multiples of 8)", pick(1, 40), 8 * pick(1, 4), 8 * pick(2, 8), 8 * pick(1, 4)));
  // out = h + norm(h), the norm's scale (and shift) the case's inputs from `w` on; and its reference.
  static constexpr auto plus_norm = [](Graph& g, ValueId h, const std::vector<ValueId>& p, size_t w, bool rms) {
    const ValueId n = rms ? ops::rmsnorm(g, h, p[w], 1e-5, "norm") : ops::layernorm(g, h, p[w], p[w + 1], 1e-5, "norm");
    return ops::add(g, h, n, "residual_2");
  };
  static constexpr auto ref_plus_norm = [](Tensor h, const std::vector<Tensor>& x, size_t w, bool rms, int64_t rows,
                                           int64_t c) {
    const Tensor n = ref_norm(h, x[w], rms ? nullptr : &x[w + 1], rows, c, rms, 1e-5);
    for (size_t i = 0; i < h.size(); ++i) h[i] += n[i];
    return h;
  };
  // A residual stream through a norm: h = a + b, out = h + norm(h).
  auto residual = [](std::string name, bool rms, int64_t rows, int64_t c) {
    std::vector<Shape> inputs{Shape{rows, c}, Shape{rows, c}, Shape{c}};
    if (!rms) inputs.push_back(Shape{c});
    return Case{std::move(name),
                inputs,
                {},
                0,
                [rms](Graph& g, const std::vector<ValueId>& p, ValueId) {
                  return plus_norm(g, ops::add(g, p[0], p[1], "residual_1"), p, 2, rms);
                },
                [=](const std::vector<Tensor>& x, const auto&) {
                  Tensor h(x[0].size());
                  for (size_t i = 0; i < h.size(); ++i) h[i] = x[0][i] + x[1][i];
                  return ref_plus_norm(std::move(h), x, 2, rms, rows, c);
                },
                1e-4,
                2e-6,
                true,
                false,
                true,
                // The sum, the norm and the second sum, each rounded.
                3,
                2};
  };
  all.push_back(residual("residual: h + layernorm(h)", false, pick(1, 40), pick(2, 70)));
  all.push_back(residual("residual: h + rmsnorm(h) (packed rows)", true, pick(1, 40), 8 * pick(1, 40)));
  // A projection onto the residual stream: h = a + (x W^T + b), out = h + norm(h). The projection's
  // output gradient is h's, which the norm's backward writes: it sums the bias gradient too.
  auto projection = [](std::string name, bool rms, int64_t rows, int64_t k, int64_t c) {
    std::vector<Shape> inputs{Shape{rows, k}, Shape{c, k}, Shape{c}, Shape{rows, c}, Shape{c}};
    if (!rms) inputs.push_back(Shape{c});
    return Case{std::move(name),
                inputs,
                {},
                0,
                [rms](Graph& g, const std::vector<ValueId>& p, ValueId) {
                  return plus_norm(g, ops::add(g, p[3], ops::linear(g, p[0], p[1], p[2], "proj"), "residual_1"), p, 4,
                                   rms);
                },
                [=](const std::vector<Tensor>& x, const auto&) {
                  Tensor h = ref_linear(x[0], x[1], &x[2], rows, k, c);
                  for (size_t i = 0; i < h.size(); ++i) h[i] += x[3][i];
                  return ref_plus_norm(std::move(h), x, 4, rms, rows, c);
                },
                1e-4,
                1e-5,
                true,
                false,
                true,
                // The product, the sum, the norm and the second sum, each rounded.
                4,
                // The gradient copy, the residual add and (after a layernorm with shift) the bias
                // gradient.
                rms ? 2 : 3};
  };
  all.push_back(projection("projection onto a residual, layernorm (packed rows)", false, pick(1, 40), pick(1, 13),
                           8 * pick(1, 40)));
  all.push_back(projection("projection onto a residual, rmsnorm", true, pick(1, 40), pick(1, 13), pick(2, 70)));
  all.push_back(residual("residual: h + rmsnorm(h) (2048 columns)", true, pick(2, 9), 2048));
  return all;
}

namespace {

// The grouped-query builders refuse a head count that the key/value heads do not divide, though
// the row width (3 + 2 x 2 heads of 2) would fit.
TEST(OpBuilders, KeyValueHeadsMustDivideTheHeads) {
  for (bool rotary : {false, true}) {
    Graph g;
    ValueId qkv = g.add_input("qkv", Shape{1, 2, 14}, DType::f32);
    try {
      if (rotary)
        ops::rotary(g, qkv, 3, {}, "rope", 2);
      else
        ops::causal_attention(g, qkv, 3, "attn", 2);
      ADD_FAILURE() << (rotary ? "rotary" : "causal_attention") << " accepted 3 heads over 2 key/value heads";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("layer ") + (rotary ? "rope" : "attn") + ": 2 key/value heads do not divide 3 heads");
    }
  }
}

class OpHarness : public ::testing::TestWithParam<int> {};

TEST_P(OpHarness, ForwardMatchesDoubleReferenceAndBackwardMatchesFiniteDifferences) {
  std::mt19937 shape_rng{static_cast<uint32_t>(GetParam())};
  for (const Case& c : cases(shape_rng)) run_case(c, uint64_t(GetParam()) + 11);
  // The fused sequences' references, in fp32 (16-bit storage rounds the sequence's intermediate
  // values, which a reference of rounded inputs does not model).
  for (const Case& c : fusion_cases(shape_rng)) run_case(c, uint64_t(GetParam()) + 11);
}

// Each seed draws new random shapes (odd sizes included) for every op.
INSTANTIATE_TEST_SUITE_P(RandomShapes, OpHarness, ::testing::Range(1, 9));

}  // namespace
}  // namespace engine::op_harness
