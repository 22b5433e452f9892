#include "nn/dropout.h"

#include <algorithm>

#include <cmath>

#include "cuda_kernels.h"
#include "elementwise/widened.h"
#include "nn/dropout_math.h"

namespace engine::ops {

namespace {

// out = in * keep(i) / (1 - p); inputs[0] is x (forward) or dy (backward).
void apply_mask(const Node& node, const KernelContext& ctx) {
  if (!ctx.training)
    return copy_kernel(node, ctx);  // evaluation: the identity (training-time scaling keeps expectations)
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  const DropoutMask mask =
      DropoutMask::make(node.attrs.floats[0], node.attrs.ints[0], ctx.seed, ctx.step, ctx.micro_step);
  const bool accumulate = ctx.accumulates(node, 0);
  if (!all_f32(ctx, {node.inputs[0], node.outputs[0]})) {
    // Chunks start at multiples of 4, so each holds whole random blocks.
    return for_each_chunk<1, 1>(ctx, {node.inputs[0]}, {node.outputs[0]}, {accumulate}, n,
                                [&](const float* const* in, float* const* out, int64_t begin, int64_t count) {
                                  for (int64_t k = 0; k < count; k += 4) {
                                    const PhiloxWords words = mask.block((begin + k) / 4);
                                    for (int64_t j = 0; j < 4 && k + j < count; ++j)
                                      out[0][k + j] = mask.apply(words.word[j], in[0][k + j]);
                                  }
                                });
  }
  const float* in = ctx.f32(node.inputs[0]);
  float* out = ctx.f32(node.outputs[0]);
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < (n + 3) / 4; ++block) {
    const PhiloxWords words = mask.block(block);
    for (int64_t j = 0; j < 4 && block * 4 + j < n; ++j) {
      int64_t i = block * 4 + j;
      float v = mask.apply(words.word[j], in[i]);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
}

// apply_mask on columns [column_begin, column_begin + width) of rows `columns` wide: element (row, k)
// takes the word of element row * columns + column_begin + k of the whole.
void apply_mask_columns(const Node& node, const KernelContext& ctx) {
  if (!ctx.training) return copy_kernel(node, ctx);
  const int64_t n = ctx.shape(node.inputs[0]).numel(), width = ctx.shape(node.inputs[0]).last();
  const int64_t columns = node.attrs.ints[1], column_begin = node.attrs.ints[2];
  const DropoutMask mask =
      DropoutMask::make(node.attrs.floats[0], node.attrs.ints[0], ctx.seed, ctx.step, ctx.micro_step);
  for_each_chunk<1, 1>(ctx, {node.inputs[0]}, {node.outputs[0]}, {ctx.accumulates(node, 0)}, n,
                       [&](const float* const* in, float* const* out, int64_t begin, int64_t count) {
                         for (int64_t k = 0; k < count; ++k) {
                           const int64_t i = begin + k, whole = i / width * columns + column_begin + i % width;
                           out[0][k] = mask.apply(mask.block(whole / 4).word[whole % 4], in[0][k]);
                         }
                       });
}

template <const OpDef& kBackward>
void dropout_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kBackward, {dy}, {t.value}, t, node.attrs, node.name);
}

// Tells dropout sites apart: the node's position in the graph, the tensor-parallel collectives left
// out, so that the ranks of a split model draw the unsplit model's masks.
int64_t dropout_salt(const Graph& g) {
  return std::count_if(g.nodes().begin(), g.nodes().end(), [](const Node& node) { return !node.op->tensor_parallel; });
}

}  // namespace

constexpr const char* kCudaDropout16 = "16-bit values read and written directly (4 at a time), fp32 arithmetic";
const OpDef kDropout{.name = "dropout",
                     .cpu = apply_mask,
                     .cuda = cuda::dropout_mask,
                     .grad = dropout_grad<kDropoutBackward>,
                     .flops = elementwise_flops,
                     .native_16bit = kWidenedChunks,
                     .cuda_16bit = kCudaDropout16,
                     .cheap_to_recompute = true};
const OpDef kDropoutBackward{.name = "dropout_backward",
                             .cpu = apply_mask,
                             .cuda = cuda::dropout_mask,
                             .flops = elementwise_flops,
                             .native_16bit = kWidenedChunks,
                             .cuda_16bit = kCudaDropout16};

namespace {

// `op` on x with probability p, its attrs the salt then `ints`; x itself when p is 0.
ValueId add_dropout(Graph& g, const OpDef& op, ValueId x, double p, const std::vector<int64_t>& ints,
                    const std::string& name) {
  // NaN fails both comparisons, so it is refused by name rather than left to the kernel, whose
  // threshold p * 2^32 would then be a NaN converted to an integer (undefined behaviour).
  if (std::isnan(p) || p >= 1) shape_error(name, "dropout probability must be below 1, got " + std::to_string(p));
  if (p <= 0) return x;
  std::vector<int64_t> attrs{dropout_salt(g)};
  attrs.insert(attrs.end(), ints.begin(), ints.end());
  ValueId y = g.add_activation(name + ".out", g.value(x).shape);
  g.add_node(Node{&op, {x}, {y}, Attrs{std::move(attrs), {p}}, false, false, name});
  return y;
}

}  // namespace

ValueId dropout(Graph& g, ValueId x, double p, const std::string& name) {
  return add_dropout(g, kDropout, x, p, {}, name);
}

const OpDef kDropoutColumns{.name = "dropout_columns",
                            .cpu = apply_mask_columns,
                            .grad = dropout_grad<kDropoutColumnsBackward>,
                            .flops = elementwise_flops,
                            .native_16bit = kWidenedChunks,
                            .cheap_to_recompute = true};
const OpDef kDropoutColumnsBackward{.name = "dropout_columns_backward",
                                    .cpu = apply_mask_columns,
                                    .flops = elementwise_flops,
                                    .native_16bit = kWidenedChunks};

ValueId dropout_columns(Graph& g, ValueId x, double p, int64_t columns, int64_t column_begin, const std::string& name) {
  const int64_t width = g.value(x).shape.last();
  if (p > 0 && (column_begin < 0 || column_begin + width > columns))
    shape_error(name, "columns [" + std::to_string(column_begin) + ", " + std::to_string(column_begin + width) +
                          ") are not within " + std::to_string(columns));
  return add_dropout(g, kDropoutColumns, x, p, {columns, column_begin}, name);
}

}  // namespace engine::ops
