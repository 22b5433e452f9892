// The op harness: every op's forward kernel against a plain double-precision reference, and its
// backward (through autodiff, as training runs it) against central finite differences of that
// reference, on random shapes including odd sizes.
//
// Each case builds a one-op graph whose float inputs are parameters (so their gradients land in
// the gradient buffers) and ends in a weighted sum L = sum(R * out) with fixed random weights R,
// whose gradient rule seeds dout = R.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <random>

#include "core/convert.h"
#include "core/rng.h"
#include "elementwise/add.h"
#include "elementwise/cast.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "graph/recompute.h"
#include "linalg/linear.h"
#include "linalg/matmul.h"
#include "loss/cross_entropy.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/rotary.h"
#include "nn/softmax.h"
#include "plan/plan.h"
#include "reduce/sum.h"
#include "runtime/executor.h"
#include "shape/transpose.h"

namespace engine {
namespace {

using Tensor = std::vector<double>;

// L = sum(R * y): the harness's loss. inputs y, R (an input value); output L (1).
void weighted_sum_cpu(const Node& node, const KernelContext& ctx) {
  const float* y = ctx.f32(node.inputs[0]);
  const float* r = ctx.f32(node.inputs[1]);
  double sum = 0;
  for (int64_t i = 0; i < ctx.shape(node.inputs[0]).numel(); ++i) sum += double(y[i]) * r[i];
  *ctx.f32(node.outputs[0]) = float(sum);
}
void weighted_sum_grad(GradBuilder& gb, const Node& node) {
  auto t = gb.target(node.inputs[0]);
  gb.emit(kAccumulate, {node.inputs[1]}, {t.value}, t, {}, node.name);
}
// Its loss stays fp32 in 16-bit precision, as the models' per-row losses do; it has no 16-bit
// path, so the executor hands it widened copies.
const OpDef kWeightedSum{"weighted_sum", weighted_sum_cpu, weighted_sum_grad, nullptr, nullptr, 0b1};

struct Case {
  std::string name;
  std::vector<Shape> float_inputs;  // become parameters
  Shape tokens;                     // optional i32 input
  int64_t token_range = 0;
  // Builds the op from the parameter values (and the token input); returns its output.
  std::function<ValueId(Graph&, const std::vector<ValueId>&, ValueId tokens)> build;
  // The same op in double precision.
  std::function<Tensor(const std::vector<Tensor>&, const std::vector<int32_t>&)> reference;
  double forward_tolerance = 1e-4;
  // fp32 kernels against finite differences of the double reference (h = 1e-5 in double: the
  // truncation error h^2/6 times the third derivative and the cancellation 1e-16 |L| / h are both
  // below 1e-9 here, so what is measured is the kernel's own fp32 error). A gradient here is a sum
  // of at most ~20 products of O(1) values, each step rounding at 2^-24 = 6e-8: at most about
  // 20 * 2^-24 = 1.2e-6 of (1 + |g|). Measured worst over the 8 seeds: 3.3e-7 (linear, matmul),
  // 2.3e-7 (norms), 2.1e-7 (attention). 2e-6 keeps that bound with a little room.
  double backward_tolerance = 2e-6;
  bool weighted = true;           // false for the loss op, whose gradient ignores R (R = 1)
  bool straight_through = false;  // the gradient is the op applied to dy (rounding), not finite differences
  bool differentiable = true;     // false for ops without a gradient rule (host_copy): forward only
};

// The unit roundoff of a storage type: half the gap between 1 and the next value.
double unit_roundoff(DType t) { return t == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

double round_to(DType t, double v) {
  if (t == DType::f32) return double(float(v));
  return t == DType::bf16 ? bf16_to_float(float_to_bf16(float(v))) : f16_to_float(float_to_f16(float(v)));
}

// How the engine computes `graph`'s nodes of `op` in their stored types, as `engine plan` prints it.
std::string compute_path(const Graph& graph, const OpDef& op) {
  for (const Node& node : graph.nodes())
    if (node.op == &op) return needs_conversion(graph, node) ? "fp32 on widened copies" : node.op->native_16bit;
  return "-";
}

// Runs case `c` with its values stored in `storage`. In bf16 or fp16 the graph goes through the
// precision pass before autodiff, as the engine's step does: parameters are read from their 16-bit
// copies, activations and their gradients are 16-bit, parameter gradients accumulate in fp32, and
// each node runs its kernel's 16-bit path or (without one) fp32 on widened copies. The reference
// is computed in double from the same 16-bit-rounded inputs.
void run_case(const Case& c, uint64_t seed, DType storage = DType::f32, bool rounded_gradient = false,
              bool print_path = false) {
  SCOPED_TRACE(c.name + " stored in " + std::string(dtype_name(storage)));
  Graph g;
  int unit = g.add_unit("op");
  std::vector<ValueId> params;
  for (size_t i = 0; i < c.float_inputs.size(); ++i)
    params.push_back(g.add_param("in" + std::to_string(i), c.float_inputs[i], unit, ParamInit::normal(1.0)));
  ValueId tokens = c.tokens.rank() ? g.add_input("tokens", c.tokens, DType::i32) : kNoValue;
  ValueId out = c.build(g, params, tokens);
  ValueId weights = g.add_input("R", g.value(out).shape, DType::f32);
  ValueId loss = g.add_activation("L", Shape{1});
  g.add_node(Node{&kWeightedSum, {out, weights}, {loss}, {}, false, false, "L"});
  g.set_loss(loss);
  g.mark_forward_end();
  apply_precision(g, storage, DType::f32);
  autodiff(g);
  if (print_path)
    for (const OpDef* op : {&ops::kLinear, &ops::kLinearBackwardInput, &ops::kLinearBackwardWeight})
      std::cout << "  " << dtype_name(storage) << " " << op->name << ": " << compute_path(g, *op) << '\n';

  ParameterStore store(g);
  store.initialize(seed);
  Executor exec(g, store, seed);
  exec.add_plan("step", plan_step(g, all_nodes(g), {out}));

  RandomStream rng(seed, RandomPurpose::test);
  std::vector<int32_t> token_values(c.tokens.rank() ? static_cast<size_t>(c.tokens.numel()) : 0);
  for (auto& t : token_values) t = int32_t(rng.below(uint64_t(c.token_range)));
  if (tokens != kNoValue) std::memcpy(exec.input(tokens), token_values.data(), token_values.size() * 4);
  const int64_t n_out = g.value(out).shape.numel();
  Tensor r(static_cast<size_t>(n_out));
  // R is representable in the storage type, so its cast at the start of a 16-bit step is exact.
  for (auto& v : r) v = c.weighted ? round_to(storage, rng.normal()) : 1.0;
  auto* r_buffer = static_cast<float*>(exec.input(weights));
  for (int64_t i = 0; i < n_out; ++i) r_buffer[i] = float(r[size_t(i)]);

  // The values the kernels read: the fp32 masters, or their 16-bit copies.
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor x(static_cast<size_t>(store.numel(int(i))));
    for (int64_t k = 0; k < store.numel(int(i)); ++k)
      x[size_t(k)] = load_float(store.param_storage(int(i)), storage, k);
    inputs.push_back(std::move(x));
  }
  store.zero_grads();
  exec.run("step", 0, 0);
  store.widen_gradients();

  // Unit roundoff u of the storage type (2^-8 bf16, 2^-11 fp16). The reference reads the same
  // rounded inputs, so what is left is the kernels' own error: every output is rounded to the type
  // once (|error| <= u |y|) on top of fp32 arithmetic (about 1e-6 relative, far below u), and a
  // gradient meets at most one more rounding on the way back (dy is exact: R is representable;
  // cross-entropy rounds its logits' gradient in place: `rounded_gradient`). So |error| <= u |y|
  // plus fp32 noise (measured worst: 0.8u forward, 0.3u for cross-entropy's gradient), and the
  // bound 2u (1 + |y|) leaves a factor of two. The other ops' parameter gradients are computed in
  // fp32 from the rounded values and accumulate in fp32: they keep the fp32 bound.
  const bool sixteen = storage != DType::f32;
  const double forward_tolerance = sixteen ? 2 * unit_roundoff(storage) : c.forward_tolerance;
  const double backward_tolerance = sixteen && rounded_gradient ? 2 * unit_roundoff(storage) : c.backward_tolerance;

  // Forward against the double reference.
  Tensor expected = c.reference(inputs, token_values);
  ASSERT_EQ(int64_t(expected.size()), n_out);
  const void* got = exec.value_f32("step", out);
  const DType out_type = g.value(out).dtype;
  double worst_forward = 0;
  for (int64_t i = 0; i < n_out; ++i) {
    const double e = expected[size_t(i)];
    const float v = load_float(got, out_type, i);
    if (forward_tolerance == 0) {
      ASSERT_EQ(v, float(e)) << "output " << i;
    } else {
      ASSERT_NEAR(v, e, forward_tolerance * (1 + std::abs(e))) << "output " << i;
      worst_forward = std::max(worst_forward, std::abs(v - e) / (1 + std::abs(e)));
    }
  }

  if (!c.differentiable) return;
  if (c.straight_through) {
    // The gradient passes through the casts, so it is dy stored in the 16-bit type on the way: the
    // reference applied to R.
    Tensor expected_grad = c.reference({r}, token_values);
    for (size_t p = 0; p < params.size(); ++p)
      for (int64_t k = 0; k < store.numel(int(p)); ++k)
        ASSERT_EQ(store.grad(int(p))[k], float(expected_grad[size_t(k)])) << "straight-through gradient at " << k;
    return;
  }
  // Backward against central differences of the reference loss.
  auto reference_loss = [&](const std::vector<Tensor>& x) {
    Tensor y = c.reference(x, token_values);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * r[i];
    return sum;
  };
  double worst_backward = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    const float* grad = store.grad(int(p));
    int64_t n = store.numel(int(p));
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / 17)) {
      std::vector<Tensor> x = inputs;
      const double h = 1e-5;
      x[p][size_t(k)] = inputs[p][size_t(k)] + h;
      double up = reference_loss(x);
      x[p][size_t(k)] = inputs[p][size_t(k)] - h;
      double down = reference_loss(x);
      double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[k], numeric, backward_tolerance * (1 + std::abs(numeric))) << "d input " << p << "[" << k << "]";
      worst_backward = std::max(worst_backward, std::abs(grad[k] - numeric) / (1 + std::abs(numeric)));
    }
  }
  if (std::getenv("OP_HARNESS_REPORT"))
    std::cout << "  " << c.name << " [" << dtype_name(storage) << "]: worst forward " << worst_forward << ", backward "
              << worst_backward << "\n";
}

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

Tensor ref_rotary(const Tensor& qkv, int64_t B, int64_t T, int64_t C, int64_t H, int64_t KV, double theta) {
  const int64_t hd = C / H, half = hd / 2, row = C + 2 * KV * hd;
  Tensor y = qkv;
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H + KV; ++h)  // the q heads, then the k heads
      for (int64_t i = 0; i < half; ++i) {
        double angle = double(bt % T) * std::pow(theta, -2.0 * double(i) / double(hd));
        size_t a = size_t(bt * row + h * hd + i), b = a + size_t(half);
        y[a] = qkv[a] * std::cos(angle) - qkv[b] * std::sin(angle);
        y[b] = qkv[a] * std::sin(angle) + qkv[b] * std::cos(angle);
      }
  return y;
}

std::vector<Case> cases(std::mt19937& shape_rng) {
  auto pick = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(shape_rng)); };
  const int64_t rows = pick(1, 9), k = pick(1, 13), m = pick(1, 11), c = pick(2, 17);
  const int64_t B = pick(1, 3), T = pick(1, 7), H = pick(1, 3), hd = 2 * pick(1, 3), C = H * hd, V = pick(2, 13);
  // Grouped-query attention: KV key/value heads, each shared by `group` query heads.
  const int64_t KV = pick(1, 2), group = pick(2, 3), GH = KV * group, GC = GH * hd;
  std::vector<Case> all;
  all.push_back(
      {"linear+bias",
       {Shape{rows, k}, Shape{m, k}, Shape{m}},
       {},
       0,
       [](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::linear(g, p[0], p[1], p[2], "linear"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_linear(x[0], x[1], &x[2], rows, k, m); }});
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
  all.push_back(
      {"rotary",
       {Shape{B, T, 3 * C}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rotary(g, p[0], H, 10000.0, "rope"); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_rotary(x[0], B, T, C, H, H, 10000.0); }});
  all.push_back(
      {"rotary (grouped-query)",
       {Shape{B, T, GC + 2 * KV * hd}},
       {},
       0,
       [=](Graph& g, const std::vector<ValueId>& p, ValueId) { return ops::rotary(g, p[0], GH, 10000.0, "rope", KV); },
       [=](const std::vector<Tensor>& x, const auto&) { return ref_rotary(x[0], B, T, GC, GH, KV, 1e4); }});
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
    Case host{"host_copy there and back",
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
    host.forward_tolerance = 0;
    host.differentiable = false;
    all.push_back(host);
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
  Case xent{"softmax_cross_entropy",
            {Shape{rows, V}},
            Shape{rows},
            V,
            [](Graph& g, const std::vector<ValueId>& p, ValueId t) {
              return ops::softmax_cross_entropy(g, p[0], t, 1.0, "xent");
            },
            [=](const std::vector<Tensor>& x, const std::vector<int32_t>& tok) {
              Tensor y(static_cast<size_t>(rows));
              for (int64_t r = 0; r < rows; ++r) {
                double mx = -1e300, z = 0;
                for (int64_t v = 0; v < V; ++v) mx = std::max(mx, x[0][size_t(r * V + v)]);
                for (int64_t v = 0; v < V; ++v) z += std::exp(x[0][size_t(r * V + v)] - mx);
                y[size_t(r)] = std::log(z) + mx - x[0][size_t(r * V + tok[size_t(r)])];
              }
              return y;
            }};
  xent.weighted = false;
  all.push_back(xent);
  return all;
}

class OpHarness : public ::testing::TestWithParam<int> {};

TEST_P(OpHarness, ForwardMatchesDoubleReferenceAndBackwardMatchesFiniteDifferences) {
  std::mt19937 shape_rng{static_cast<uint32_t>(GetParam())};
  for (const Case& c : cases(shape_rng)) run_case(c, uint64_t(GetParam()) + 11);
}

// Each seed draws new random shapes (odd sizes included) for every op.
INSTANTIATE_TEST_SUITE_P(RandomShapes, OpHarness, ::testing::Range(1, 9));

// The ops with a 16-bit path: elementwise chunks (activations, add, swiglu), the norms, the
// embedding, cross-entropy, the linear layer (oneDNN's 16-bit matmul where this CPU has one) and
// reshape (a copy in the stored type).
// The value says whether the parameters' gradient is rounded to the storage type on its way.
const std::map<std::string, bool> kSixteenBit{{"linear+bias", false},
                                              {"linear (3-D input, no bias)", false},
                                              {"layernorm", false},
                                              {"layernorm without shift", false},
                                              {"rmsnorm", false},
                                              {"gelu", false},
                                              {"relu", false},
                                              {"silu", false},
                                              {"swiglu", false},
                                              {"add", false},
                                              {"embedding with positions", false},
                                              {"softmax_cross_entropy", true},
                                              {"reshape", false}};

class OpHarness16 : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(OpHarness16, SixteenBitStorageMatchesDoubleReferenceOfTheRoundedInputs) {
  const auto [seed, storage] = GetParam();
  std::mt19937 shape_rng{static_cast<uint32_t>(seed)};
  size_t ran = 0;
  for (const Case& c : cases(shape_rng)) {
    auto it = kSixteenBit.find(c.name);
    if (it == kSixteenBit.end()) continue;
    ++ran;
    // The first seed names the path each node took (the linear one depends on this oneDNN and CPU).
    run_case(c, uint64_t(seed) + 11, storage, it->second, seed == 1 && c.name.starts_with("linear+"));
  }
  EXPECT_EQ(ran, kSixteenBit.size()) << "a 16-bit case lost its op";
}

INSTANTIATE_TEST_SUITE_P(RandomShapes, OpHarness16,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& test) {
                           return std::string(dtype_name(std::get<1>(test.param))) + "_seed" +
                                  std::to_string(std::get<0>(test.param));
                         });

}  // namespace
}  // namespace engine
