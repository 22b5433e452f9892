#include "nn/layernorm.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "cuda_kernels.h"
#include "elementwise/widened.h"
#include "fusion_util.h"
#include "graph/autodiff.h"
#include "linalg/linear.h"
#include "nn/row_launch.h"
#include "nn/softmax_rows.h"

namespace engine::ops {

namespace {

// Shared by both norms: attrs.ints[0] = 1 for rmsnorm (no mean, no shift); attrs.ints[1] = 1 when
// a layernorm has a shift (GPT-2 with bias: false has none).
bool is_rms(const Node& node) { return node.attrs.ints[0] == 1; }
bool has_shift(const Node& node) { return node.attrs.ints[1] == 1; }

// A row's mean (0 for rmsnorm) and its sum of squared deviations from it: float sums over 16
// interleaved lanes added in a fixed tree (nn/softmax_rows.h), the same bits at every vector
// width, or double ones where a float sum overflows (|x| past about 1e19 / sqrt(c), which bf16 can
// hold).
struct Moments {
  float mean;
  double squares;
};
[[gnu::always_inline]] inline Moments row_moments(const float* x, int64_t c, bool rms) {
  float mean = 0;
  if (!rms) mean = row_sum(x, c) / float(c);
  float lanes[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= c; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) lanes[j] += (x[i + j] - mean) * (x[i + j] - mean);
  for (int j = 0; i + j < c; ++j) lanes[j] += (x[i + j] - mean) * (x[i + j] - mean);
  const float squares = lane_total(lanes);
  if (std::isfinite(mean) && std::isfinite(squares)) return {mean, double(squares)};
  double sum = 0, wide_squares = 0;
  if (!rms)
    for (int64_t k = 0; k < c; ++k) sum += x[k];
  const double wide_mean = sum / double(c);
  for (int64_t k = 0; k < c; ++k) wide_squares += (x[k] - wide_mean) * (x[k] - wide_mean);
  return {float(wide_mean), wide_squares};
}

// One row of the forward: y = (x - mean) rstd w (+ b); returns {mean, rstd}.
[[gnu::always_inline]] inline std::pair<float, float> norm_row(const float* xr, int64_t c, bool rms, double eps,
                                                               const float* w, const float* b, float* yr) {
  const Moments moments = row_moments(xr, c, rms);
  const float mean = moments.mean;
  const float rstd = float(1.0 / std::sqrt(moments.squares / double(c) + eps));
  if (b) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - mean) * rstd * w[i];
  }
  return {mean, rstd};
}

// One row of the backward: dx (= or +=) rstd (g - mean(g) - xhat mean(g xhat)), g = dy w (rmsnorm:
// no mean(g) term), and dy xhat (and dy) added to the block's scale (and shift) gradient sums.
[[gnu::always_inline]] inline void norm_backward_row(const float* dyr, const float* xr, const float* w, float m,
                                                     float s, int64_t c, bool rms, float* dw_sum, float* db_sum,
                                                     float* dxr, bool accumulate) {
  float sum_g[kRowLanes] = {}, sum_gx[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= c; i += kRowLanes)
#pragma omp simd
    for (int j = 0; j < kRowLanes; ++j) {
      const float g = dyr[i + j] * w[i + j], xhat = (xr[i + j] - m) * s;
      sum_g[j] += g;
      sum_gx[j] += g * xhat;
      dw_sum[i + j] += dyr[i + j] * xhat;
    }
  for (int j = 0; i + j < c; ++j) {
    const float g = dyr[i + j] * w[i + j], xhat = (xr[i + j] - m) * s;
    sum_g[j] += g;
    sum_gx[j] += g * xhat;
    dw_sum[i + j] += dyr[i + j] * xhat;
  }
  if (db_sum) {
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) db_sum[k] += dyr[k];
  }
  const float inv_c = 1.0f / float(c);
  const float mean_g = rms ? 0.0f : lane_total(sum_g) * inv_c, mean_gx = lane_total(sum_gx) * inv_c;
  if (accumulate) {
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) dxr[k] += s * (dyr[k] * w[k] - mean_g - (xr[k] - m) * s * mean_gx);
  } else {
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) dxr[k] = s * (dyr[k] * w[k] - mean_g - (xr[k] - m) * s * mean_gx);
  }
}

// The rows at each vector width (core/cpu_isa.h), called from the parallel loops below.
std::pair<float, float> norm_row_avx2(const float* xr, int64_t c, bool rms, double eps, const float* w, const float* b,
                                      float* yr) {
  return norm_row(xr, c, rms, eps, w, b, yr);
}
ENGINE_TARGET_AVX512 std::pair<float, float> norm_row_avx512(const float* xr, int64_t c, bool rms, double eps,
                                                             const float* w, const float* b, float* yr) {
  return norm_row(xr, c, rms, eps, w, b, yr);
}
void norm_backward_row_avx2(const float* dyr, const float* xr, const float* w, float m, float s, int64_t c, bool rms,
                            float* dw_sum, float* db_sum, float* dxr, bool accumulate) {
  norm_backward_row(dyr, xr, w, m, s, c, rms, dw_sum, db_sum, dxr, accumulate);
}
ENGINE_TARGET_AVX512 void norm_backward_row_avx512(const float* dyr, const float* xr, const float* w, float m, float s,
                                                   int64_t c, bool rms, float* dw_sum, float* db_sum, float* dxr,
                                                   bool accumulate) {
  norm_backward_row(dyr, xr, w, m, s, c, rms, dw_sum, db_sum, dxr, accumulate);
}

// inputs x, w [, b]; outputs y, mean, rstd
//
// Each row in two passes over its (cached) values: the mean, then the variance around it (two
// passes, not one of x and x^2, so a large mean does not cancel the variance away), both in 16
// float lanes - far below fp32's 1e-4 forward tolerance at any width a model uses - and the output
// in a third pass.
void norm_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[0]);
  const int64_t rows = xs.rows(), c = xs.last();
  const bool rms = is_rms(node);
  const double eps = node.attrs.floats[0];
  const InputRows x = input_rows(ctx, node.inputs[0], c);
  // The scale and shift are one row each (their 16-bit copies are widened once per call).
  const InputRows weight = input_rows(ctx, node.inputs[1], c),
                  shift = input_rows(ctx, node.inputs[has_shift(node) ? 2 : 1], c);
  std::vector<float> weight_buffer = weight.buffer(), shift_buffer = shift.buffer();
  const float* w = weight.row(0, weight_buffer.data());
  const float* b = has_shift(node) ? shift.row(0, shift_buffer.data()) : nullptr;
  const OutputRows y = output_rows(ctx, node.outputs[0], c, false);
  float* mean_out = ctx.f32(node.outputs[1]);
  float* rstd_out = ctx.f32(node.outputs[2]);
  auto* row = kernel_isa() == CpuIsa::avx512 ? norm_row_avx512 : norm_row_avx2;
#pragma omp parallel if (rows * c > kSerialElements)
  {
    std::vector<float> x_buffer = x.buffer(), y_buffer = y.buffer();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.row(r, x_buffer.data());
      float* yr = y.row(r, y_buffer.data());
      const std::pair<float, float> mean_rstd = row(xr, c, rms, eps, w, b, yr);
      y.store(r, yr);
      mean_out[r] = mean_rstd.first;
      rstd_out[r] = mean_rstd.second;
    }
  }
}

// inputs dy, x, w, mean, rstd; outputs dx, dw [, db]
//
// One pass over the rows computes dx and the scale and shift gradients together (dy and x are read
// once). The latter are summed per block of kBlockRows rows in float, and the blocks' sums added in
// double in a fixed order, so the result does not depend on the thread count.
// inputs dy, x, w, mean, rstd; outputs dx [, dw [, db]]
void norm_backward_rows_cpu(const Node& node, const KernelContext& ctx) {
  constexpr int64_t kBlockRows = 32;
  const Shape& xs = ctx.shape(node.inputs[1]);
  const int64_t rows = xs.rows(), c = xs.last();
  const bool rms = is_rms(node), shift = has_shift(node);
  const InputRows dy = input_rows(ctx, node.inputs[0], c);
  const InputRows x = input_rows(ctx, node.inputs[1], c);
  const InputRows weight = input_rows(ctx, node.inputs[2], c);
  std::vector<float> weight_buffer = weight.buffer();
  const float* w = weight.row(0, weight_buffer.data());
  const float* mean = ctx.f32(node.inputs[3]);
  const float* rstd = ctx.f32(node.inputs[4]);
  const bool accumulate_dx = ctx.accumulates(node, 0);
  const OutputRows dx = output_rows(ctx, node.outputs[0], c, accumulate_dx);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<float> dw_blocks(static_cast<size_t>(blocks * c)), db_blocks(shift ? dw_blocks.size() : 0);
  auto* row = kernel_isa() == CpuIsa::avx512 ? norm_backward_row_avx512 : norm_backward_row_avx2;
#pragma omp parallel if (rows * c > kSerialElements)
  {
    std::vector<float> dy_buffer = dy.buffer(), x_buffer = x.buffer(), dx_buffer = dx.buffer();
#pragma omp for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      float* dw_sum = dw_blocks.data() + block * c;
      float* db_sum = shift ? db_blocks.data() + block * c : nullptr;
      for (int64_t r = block * kBlockRows; r < std::min(rows, (block + 1) * kBlockRows); ++r) {
        const float* dyr = dy.row(r, dy_buffer.data());
        const float* xr = x.row(r, x_buffer.data());
        float* dxr = dx.row(r, dx_buffer.data());
        row(dyr, xr, w, mean[r], rstd[r], c, rms, dw_sum, db_sum, dxr, accumulate_dx);
        dx.store(r, dxr);
      }
    }
  }
  if (node.outputs.size() == 1) return;  // a frozen scale and shift: dx alone
  // The blocks' sums, added to the stored gradients (rounded once where those are 16-bit).
  void* dw = ctx.data(node.outputs[1]);
  void* db = shift ? ctx.data(node.outputs[2]) : nullptr;
  const DType dw_type = ctx.dtype(node.outputs[1]), db_type = shift ? ctx.dtype(node.outputs[2]) : DType::f32;
#pragma omp parallel for schedule(static) if (blocks * c > kSerialElements)
  for (int64_t i = 0; i < c; ++i) {
    double sw = 0, sb = 0;
    for (int64_t block = 0; block < blocks; ++block) {
      sw += dw_blocks[size_t(block * c + i)];
      if (db) sb += db_blocks[size_t(block * c + i)];
    }
    add_float(dw, dw_type, i, float(sw));
    if (db) add_float(db, db_type, i, float(sb));
  }
}

// The same, and with sums_norm_output (fuse_norm_bias_gradients) dx's column sums as stored added
// to the last output, as the linear backward's CPU kernel sums a bias gradient.
void norm_backward_cpu(const Node& node, const KernelContext& ctx) {
  if (!sums_norm_output(node)) return norm_backward_rows_cpu(node, ctx);
  Node backward = node;
  backward.outputs.pop_back();
  backward.attrs.ints.resize(2);
  norm_backward_rows_cpu(backward, ctx);
  const ValueId dx = node.outputs[0], sums = node.outputs.back();
  const Shape& shape = ctx.shape(dx);
  add_bias_gradient(ctx.data(dx), ctx.dtype(dx), shape.rows(), shape.last(), ctx.data(sums), ctx.dtype(sums));
}

void norm_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  bool rms = is_rms(node);
  ValueId x = node.inputs[0], w = node.inputs[1];
  auto dx = gb.target(x);
  // A frozen scale (LoRA's base) has no gradient: the backward writes dx alone.
  std::vector<ValueId> outs{dx.value};
  if (gb.wants(w)) {
    outs.push_back(gb.target(w).value);
    if (has_shift(node)) outs.push_back(gb.target(node.inputs[2]).value);
  } else {
    ENGINE_CHECK(!has_shift(node) || !gb.wants(node.inputs[2]), node.name + ": a frozen scale with a trained shift");
  }
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

constexpr const char* kCudaRows16 = "16-bit rows read and written directly, fp32 arithmetic";

// inputs dy, x, w, mean, rstd, base; outputs dx, dw [, db]: base copied to dx, the backward added.
void norm_backward_onto_cpu(const Node& node, const KernelContext& ctx) {
  copy_kernel(Node{&kAccumulate, {node.inputs[5]}, {node.outputs[0]}, {}, false, true, node.name}, ctx);
  std::vector<ValueId> inputs(node.inputs.begin(), node.inputs.begin() + 5);
  norm_backward_cpu(Node{node.op, inputs, node.outputs, node.attrs, true, true, node.name}, ctx);
}

bool is_norm_backward(const OpDef* op) { return op == &kLayerNormBackward || op == &kRmsNormBackward; }
bool is_any_norm_backward(const OpDef* op) { return is_norm_backward(op) || op == &kNormBackwardOnto; }

}  // namespace

constexpr uint32_t kStatisticsInFp32 = 0b110;  // outputs 1 and 2: mean and rstd
const OpDef kLayerNorm{.name = "layernorm",
                       .cpu = norm_cpu,
                       .cuda = cuda::norm,
                       .grad = norm_grad,
                       .flops = norm_flops,
                       .native_16bit = kWidenedRows,
                       .fp32_outputs = kStatisticsInFp32,
                       .cuda_16bit = kCudaRows16,
                       .cheap_to_recompute = true};
const OpDef kLayerNormBackward{.name = "layernorm_backward",
                               .cpu = norm_backward_cpu,
                               .cuda = cuda::norm_backward,
                               .flops = norm_flops,
                               .native_16bit = kWidenedRows,
                               .cuda_16bit = kCudaRows16};
const OpDef kRmsNorm{.name = "rmsnorm",
                     .cpu = norm_cpu,
                     .cuda = cuda::norm,
                     .grad = norm_grad,
                     .flops = norm_flops,
                     .native_16bit = kWidenedRows,
                     .fp32_outputs = kStatisticsInFp32,
                     .cuda_16bit = kCudaRows16,
                     .cheap_to_recompute = true};
const OpDef kRmsNormBackward{.name = "rmsnorm_backward",
                             .cpu = norm_backward_cpu,
                             .cuda = cuda::norm_backward,
                             .flops = norm_flops,
                             .native_16bit = kWidenedRows,
                             .cuda_16bit = kCudaRows16};

const OpDef kNormBackwardOnto{.name = "norm_backward_onto",
                              .cpu = norm_backward_onto_cpu,
                              .cuda = cuda::norm_backward,
                              .flops = norm_flops,
                              .native_16bit = kWidenedRows,
                              .cuda_16bit = kCudaRows16};

int fuse_gradient_copies(Graph& g) {
  std::vector<Node>& nodes = g.mutable_nodes();
  std::vector<bool> erased(nodes.size());
  int fused = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& copy = nodes[i];
    if (copy.op != &kAccumulate || copy.accumulate) continue;
    const ValueId base = copy.inputs[0], dx = copy.outputs[0];
    if (g.value(dx).placement != Placement::activation || g.value(base).dtype != g.value(dx).dtype) continue;
    // The next node that touches the copy; base must not change before it reads it.
    size_t j = i + 1;
    bool base_written = false;
    for (; j < nodes.size(); ++j) {
      const Node& n = nodes[j];
      base_written = base_written || writes(n, base);
      if (writes(n, dx) || std::find(n.inputs.begin(), n.inputs.end(), dx) != n.inputs.end()) break;
    }
    if (j == nodes.size() || base_written) continue;
    Node& norm = nodes[j];
    if (!is_norm_backward(norm.op) || !norm.accumulate || norm.outputs[0] != dx || norm.inputs.size() != 5) continue;
    norm.op = &kNormBackwardOnto;
    norm.inputs.push_back(base);
    norm.accumulate = false;
    erased[i] = true;
    ++fused;
  }
  g.remove_nodes(erased);
  return fused;
}

int fuse_norm_bias_gradients(Graph& g) {
  std::vector<Node>& nodes = g.mutable_nodes();
  int fused = 0;
  for (size_t j = 0; j < nodes.size(); ++j) {
    Node& linear = nodes[j];
    if (linear.op != &kLinearBackwardWeight || linear.outputs.size() != 2) continue;
    const ValueId dy = linear.inputs[0], db = linear.outputs[1];
    if (g.value(db).placement != Placement::gradient) continue;
    // The last node before the product that writes dy: a norm backward's dx, and nothing between
    // them writes dy or the bias gradient.
    size_t i = j;
    while (i > 0 && !writes(nodes[i - 1], dy)) --i;
    if (i == 0) continue;
    Node& norm = nodes[--i];
    // Rows no wider than the kernel's registers hold the extra running sums for.
    const int64_t c = g.value(dy).shape.last(), pack = 16 / int64_t(dtype_size(g.value(dy).dtype));
    if (c > kNormMaxPacksWithColumnSums * kNormLanes * pack) continue;
    if (!is_any_norm_backward(norm.op) || norm.outputs[0] != dy || sums_norm_output(norm) || !has_shift(norm) ||
        norm.outputs.size() != 3 || writes(norm, db) || writes_between(nodes, i, j, {db}))
      continue;
    norm.outputs.push_back(db);
    norm.attrs.ints.resize(3);
    norm.attrs.ints[2] = 1;
    linear.outputs.pop_back();
    ++fused;
  }
  return fused;
}

ValueId layernorm(Graph& g, ValueId x, ValueId w, ValueId b, double eps, const std::string& name) {
  return norm(g, kLayerNorm, x, w, b, eps, false, name);
}

ValueId rmsnorm(Graph& g, ValueId x, ValueId w, double eps, const std::string& name) {
  return norm(g, kRmsNorm, x, w, kNoValue, eps, true, name);
}

}  // namespace engine::ops
