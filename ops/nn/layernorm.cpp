#include "nn/layernorm.h"

#include <cmath>
#include <vector>

#include "core/convert.h"

namespace engine::ops {

namespace {

// Rows of a value in f32: the stored row itself, or (16-bit storage) the row widened into `buffer`.
struct Rows {
  const std::byte* data;
  DType type;
  int64_t width;
  const float* row(int64_t r, std::vector<float>& buffer) const {
    if (type == DType::f32) return reinterpret_cast<const float*>(data) + r * width;
    widen(data + r * width * 2, type, buffer.data(), width);
    return buffer.data();
  }
  float at(int64_t i) const { return load_float(data, type, i); }
  // A buffer for row(): empty for f32, which reads in place.
  std::vector<float> buffer() const { return std::vector<float>(type == DType::f32 ? 0 : static_cast<size_t>(width)); }
};
Rows rows_of(const KernelContext& ctx, ValueId id, int64_t width) {
  return {static_cast<const std::byte*>(ctx.data(id)), ctx.dtype(id), width};
}
// Where a kernel writes an output row before rounding it: in place for f32, else a buffer.
std::vector<float> output_buffer(DType type, int64_t width) {
  return std::vector<float>(type == DType::f32 ? 0 : static_cast<size_t>(width));
}

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
  const Rows x = rows_of(ctx, node.inputs[0], c);
  // The scale and shift are one row each (their 16-bit copies are widened once per call).
  const Rows weight = rows_of(ctx, node.inputs[1], c), shift = rows_of(ctx, node.inputs[has_shift(node) ? 2 : 1], c);
  std::vector<float> weight_buffer = weight.buffer(), shift_buffer = shift.buffer();
  const float* w = weight.row(0, weight_buffer);
  const float* b = has_shift(node) ? shift.row(0, shift_buffer) : nullptr;
  const DType y_type = ctx.dtype(node.outputs[0]);
  float* mean_out = ctx.f32(node.outputs[1]);
  float* rstd_out = ctx.f32(node.outputs[2]);
#pragma omp parallel
  {
    std::vector<float> x_buffer = x.buffer(), y_buffer = output_buffer(y_type, c);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.row(r, x_buffer);
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
      float* yr = y_type == DType::f32 ? ctx.f32(node.outputs[0]) + r * c : y_buffer.data();
      if (rms) {
        for (int64_t i = 0; i < c; ++i) yr[i] = xr[i] * rstd * w[i];
      } else {
        for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - m) * rstd * w[i] + (b ? b[i] : 0.0f);
      }
      if (y_type != DType::f32) narrow(yr, static_cast<std::byte*>(ctx.data(node.outputs[0])) + r * c * 2, y_type, c);
      mean_out[r] = m;
      rstd_out[r] = rstd;
    }
  }
}

// inputs dy, x, w, mean, rstd; outputs dx, dw [, db]
void norm_backward_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[1]);
  int64_t rows = xs.rows(), c = xs.last();
  bool rms = is_rms(node);
  const Rows dy = rows_of(ctx, node.inputs[0], c);
  const Rows x = rows_of(ctx, node.inputs[1], c);
  const Rows weight = rows_of(ctx, node.inputs[2], c);
  std::vector<float> weight_buffer = weight.buffer();
  const float* w = weight.row(0, weight_buffer);
  const float* mean = ctx.f32(node.inputs[3]);
  const float* rstd = ctx.f32(node.inputs[4]);
  const DType dx_type = ctx.dtype(node.outputs[0]);
  bool accumulate_dx = ctx.accumulates(node, 0);
#pragma omp parallel
  {
    std::vector<float> dy_buffer = dy.buffer(), x_buffer = x.buffer(), dx_buffer = output_buffer(dx_type, c);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* dyr = dy.row(r, dy_buffer);
      const float* xr = x.row(r, x_buffer);
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
      auto* dx_row = static_cast<std::byte*>(ctx.data(node.outputs[0])) + r * c * int64_t(dtype_size(dx_type));
      float* dxr = dx_type == DType::f32 ? reinterpret_cast<float*>(dx_row) : dx_buffer.data();
      if (dx_type != DType::f32 && accumulate_dx) widen(dx_row, dx_type, dxr, c);
      for (int64_t i = 0; i < c; ++i) {
        double g = double(dyr[i]) * w[i];
        double xhat = (xr[i] - m) * s;
        float v = float(s * (g - mean_g - xhat * mean_gx));
        dxr[i] = accumulate_dx ? dxr[i] + v : v;
      }
      if (dx_type != DType::f32) narrow(dxr, dx_row, dx_type, c);
    }
  }
  const bool shift = has_shift(node);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double d = dy.at(r * c + i);
      sw += d * (x.at(r * c + i) - mean[r]) * rstd[r];
      sb += d;
    }
    add_float(ctx.data(node.outputs[1]), ctx.dtype(node.outputs[1]), i, float(sw));
    if (shift) add_float(ctx.data(node.outputs[2]), ctx.dtype(node.outputs[2]), i, float(sb));
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

constexpr const char* kRows16 = "fp32 on 16-bit rows widened in cache";

}  // namespace

const OpDef kLayerNorm{"layernorm", norm_cpu, norm_grad, norm_flops, kRows16, 0b110};  // mean, rstd in fp32
const OpDef kLayerNormBackward{"layernorm_backward", norm_backward_cpu, nullptr, norm_flops, kRows16};
const OpDef kRmsNorm{"rmsnorm", norm_cpu, norm_grad, norm_flops, kRows16, 0b110};
const OpDef kRmsNormBackward{"rmsnorm_backward", norm_backward_cpu, nullptr, norm_flops, kRows16};

ValueId layernorm(Graph& g, ValueId x, ValueId w, ValueId b, double eps, const std::string& name) {
  return norm(g, kLayerNorm, x, w, b, eps, false, name);
}

ValueId rmsnorm(Graph& g, ValueId x, ValueId w, double eps, const std::string& name) {
  return norm(g, kRmsNorm, x, w, kNoValue, eps, true, name);
}

}  // namespace engine::ops
