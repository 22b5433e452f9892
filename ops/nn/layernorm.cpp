#include "nn/layernorm.h"

#include <cmath>

namespace engine::ops {

namespace {

// Shared by both norms: attrs.ints[0] = 1 for rmsnorm (no mean, no shift); attrs.ints[1] = 1 when
// a layernorm has a shift (GPT-2 with bias: false has none).
bool is_rms(const Node& node) { return node.attrs.ints[0] == 1; }
bool has_shift(const Node& node) { return node.attrs.ints[1] == 1; }

// inputs x, w [, b]; outputs y, mean, rstd
void norm_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[0]);
  int64_t rows = xs.rows(), c = xs.last();
  bool rms = is_rms(node);
  double eps = node.attrs.floats[0];
  const float* x = ctx.f32(node.inputs[0]);
  const float* w = ctx.f32(node.inputs[1]);
  const float* b = has_shift(node) ? ctx.f32(node.inputs[2]) : nullptr;
  float* y = ctx.f32(node.outputs[0]);
  float* mean_out = ctx.f32(node.outputs[1]);
  float* rstd_out = ctx.f32(node.outputs[2]);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    double mean = 0;
    if (!rms) {
      for (int64_t i = 0; i < c; ++i) mean += xr[i];
      mean /= double(c);
    }
    double var = 0;
    for (int64_t i = 0; i < c; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(c);
    float rstd = float(1.0 / std::sqrt(var + eps));
    float m = float(mean);
    float* yr = y + r * c;
    if (rms) {
      for (int64_t i = 0; i < c; ++i) yr[i] = xr[i] * rstd * w[i];
    } else {
      for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - m) * rstd * w[i] + (b ? b[i] : 0.0f);
    }
    mean_out[r] = m;
    rstd_out[r] = rstd;
  }
}

// inputs dy, x, w, mean, rstd; outputs dx, dw [, db]
void norm_backward_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[1]);
  int64_t rows = xs.rows(), c = xs.last();
  bool rms = is_rms(node);
  const float* dy = ctx.f32(node.inputs[0]);
  const float* x = ctx.f32(node.inputs[1]);
  const float* w = ctx.f32(node.inputs[2]);
  const float* mean = ctx.f32(node.inputs[3]);
  const float* rstd = ctx.f32(node.inputs[4]);
  float* dx = ctx.f32(node.outputs[0]);
  bool accumulate_dx = ctx.accumulates(node, 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * c;
    const float* xr = x + r * c;
    float m = mean[r], s = rstd[r];
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w   (rms: no mean(g) term)
    double mean_g = 0, mean_gx = 0;
    for (int64_t i = 0; i < c; ++i) {
      double g = double(dyr[i]) * w[i];
      double xhat = (xr[i] - m) * s;
      mean_g += g;
      mean_gx += g * xhat;
    }
    mean_g = rms ? 0.0 : mean_g / double(c);
    mean_gx /= double(c);
    float* dxr = dx + r * c;
    for (int64_t i = 0; i < c; ++i) {
      double g = double(dyr[i]) * w[i];
      double xhat = (xr[i] - m) * s;
      float v = float(s * (g - mean_g - xhat * mean_gx));
      dxr[i] = accumulate_dx ? dxr[i] + v : v;
    }
  }
  float* dw = ctx.f32(node.outputs[1]);
  float* db = has_shift(node) ? ctx.f32(node.outputs[2]) : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double d = dy[r * c + i];
      sw += d * (x[r * c + i] - mean[r]) * rstd[r];
      sb += d;
    }
    dw[i] += float(sw);
    if (db) db[i] += float(sb);
  }
}

void norm_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  bool rms = is_rms(node);
  ValueId x = node.inputs[0], w = node.inputs[1];
  auto dx = gb.target(x);
  std::vector<ValueId> outs{dx.value, gb.target(w).value};
  if (has_shift(node)) outs.push_back(gb.target(node.inputs[2]).value);
  gb.emit(rms ? kRmsNormBackward : kLayerNormBackward, {dy, x, w, node.outputs[1], node.outputs[2]}, outs, dx,
          node.attrs, node.name);
}

ValueId norm(Graph& g, const OpDef& op, ValueId x, ValueId w, ValueId b, double eps, bool rms,
             const std::string& name) {
  const Shape& xs = g.value(x).shape;
  if (g.value(w).shape != Shape{xs.last()})
    shape_error(name, "scale " + g.value(w).shape.str() + " does not match input " + xs.str());
  if (b != kNoValue && g.value(b).shape != Shape{xs.last()})
    shape_error(name, "shift does not match input " + xs.str());
  ValueId y = g.add_activation(name + ".out", xs);
  ValueId mean = g.add_activation(name + ".mean", Shape{xs.rows()});
  ValueId rstd = g.add_activation(name + ".rstd", Shape{xs.rows()});
  std::vector<ValueId> inputs{x, w};
  if (b != kNoValue) inputs.push_back(b);
  g.add_node(
      Node{&op, inputs, {y, mean, rstd}, Attrs{{rms ? 1 : 0, b != kNoValue ? 1 : 0}, {eps}}, false, false, name});
  return y;
}

double norm_flops(const Graph& g, const Node& n) { return 8.0 * double(g.value(n.inputs[0]).shape.numel()); }

}  // namespace

const OpDef kLayerNorm{"layernorm", norm_cpu, norm_grad, norm_flops, nullptr, 0b110};  // mean, rstd in fp32
const OpDef kLayerNormBackward{"layernorm_backward", norm_backward_cpu, nullptr, norm_flops};
const OpDef kRmsNorm{"rmsnorm", norm_cpu, norm_grad, norm_flops, nullptr, 0b110};
const OpDef kRmsNormBackward{"rmsnorm_backward", norm_backward_cpu, nullptr, norm_flops};

ValueId layernorm(Graph& g, ValueId x, ValueId w, ValueId b, double eps, const std::string& name) {
  return norm(g, kLayerNorm, x, w, b, eps, false, name);
}

ValueId rmsnorm(Graph& g, ValueId x, ValueId w, double eps, const std::string& name) {
  return norm(g, kRmsNorm, x, w, kNoValue, eps, true, name);
}

}  // namespace engine::ops
