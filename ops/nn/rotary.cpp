#include "nn/rotary.h"

#include "cuda_kernels.h"
#include "elementwise/widened.h"
#include "nn/qkv_layout.h"

#include <cmath>
#include <vector>

namespace engine::ops {

namespace {

// direction +1 rotates (forward), -1 rotates back (backward). inputs[0] is the source; a row is
// one position's q, k and v heads, taken through the widened-rows route in 16-bit storage.
void rotate(const Node& node, const KernelContext& ctx, float direction) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t heads = node.attrs.ints[0], kv_heads = node.attrs.ints[1];
  const int64_t batch = s[0], time = s[1], row = s[2], hd = row / (heads + 2 * kv_heads), half = hd / 2;
  const int64_t rotated = (heads + kv_heads) * hd;  // q and k heads side by side, then v
  const RopeFrequencies frequencies = rope_frequencies(node.attrs);
  const bool accumulate = ctx.accumulates(node, 0);
  const InputRows in = input_rows(ctx, node.inputs[0], row);
  const OutputRows out = output_rows(ctx, node.outputs[0], row, accumulate);
  const int32_t* ids = node.inputs.size() > 1 ? ctx.i32(node.inputs[1]) : nullptr;  // packed documents
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = rope_inverse_frequency(frequencies, i, hd);
#pragma omp parallel
  {
    std::vector<float> in_buffer = in.buffer(), out_buffer = out.buffer();
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < batch * time; ++bt) {
      const int64_t t = ids ? ids[bt] : bt % time;
      const float* src = in.row(bt, in_buffer.data());
      float* dst = out.row(bt, out_buffer.data());
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* x = src + h * hd;
        float* y = dst + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          double angle = double(t) * inv_freq[size_t(i)];
          float cs = float(std::cos(angle)), sn = direction * float(std::sin(angle));
          float a = x[i] * cs - x[i + half] * sn;
          float b = x[i] * sn + x[i + half] * cs;
          y[i] = accumulate ? y[i] + a : a;
          y[i + half] = accumulate ? y[i + half] + b : b;
        }
      }
      for (int64_t i = rotated; i < row; ++i) dst[i] = accumulate ? dst[i] + src[i] : src[i];
      out.store(bt, dst);
    }
  }
}

void rotary_cpu(const Node& node, const KernelContext& ctx) { rotate(node, ctx, 1.0f); }
void rotary_backward_cpu(const Node& node, const KernelContext& ctx) { rotate(node, ctx, -1.0f); }

void rotary_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  std::vector<ValueId> inputs{dy};
  if (node.inputs.size() > 1) inputs.push_back(node.inputs[1]);
  gb.emit(kRotaryBackward, inputs, {t.value}, t, node.attrs, node.name);
}

}  // namespace

double rotary_flops(const Graph& g, const Node& n) { return 3.0 * double(g.value(n.inputs[0]).shape.numel()); }

const OpDef kRotary{.name = "rotary",
                    .cpu = rotary_cpu,
                    .cuda = cuda_without_position_ids<cuda::rotary, 1>,
                    .grad = rotary_grad,
                    .flops = rotary_flops,
                    .native_16bit = kWidenedRows,
                    .cuda_16bit = "16-bit values read and written directly, fp32 arithmetic",
                    .cheap_to_recompute = true};
const OpDef kRotaryBackward{.name = "rotary_backward",
                            .cpu = rotary_backward_cpu,
                            .cuda = cuda_without_position_ids<cuda::rotary_backward, 1>,
                            .flops = rotary_flops,
                            .native_16bit = kWidenedRows,
                            .cuda_16bit = "16-bit values read and written directly, fp32 arithmetic"};

RopeFrequencies rope_frequencies(const Attrs& attrs) {
  return RopeFrequencies{.theta = attrs.floats[0],
                         .scaling = RopeScaling(attrs.ints[2]),
                         .factor = attrs.floats[1],
                         .low_freq_factor = attrs.floats[2],
                         .high_freq_factor = attrs.floats[3],
                         .original_context = attrs.floats[4]};
}

ValueId rotary(Graph& g, ValueId qkv, int64_t n_head, const RopeFrequencies& frequencies, const std::string& name,
               int64_t kv_heads, ValueId positions) {
  const Shape& s = g.value(qkv).shape;
  const QkvLayout layout = qkv_layout(s, n_head, kv_heads, name);  // the layout causal_attention reads
  kv_heads = layout.kv_heads;
  if (layout.head_size % 2 != 0) shape_error(name, "rotary needs an even head size");
  ValueId y = g.add_activation(name + ".out", s);
  std::vector<ValueId> inputs{qkv};
  if (positions != kNoValue) {
    if (g.value(positions).shape != Shape{s[0], s[1]} || g.value(positions).dtype != DType::i32)
      shape_error(name, "position ids must be (B, T) int32");
    inputs.push_back(positions);
  }
  const RopeFrequencies& f = frequencies;
  g.add_node(Node{&kRotary,
                  inputs,
                  {y},
                  Attrs{{n_head, kv_heads, int64_t(f.scaling)},
                        {f.theta, f.factor, f.low_freq_factor, f.high_freq_factor, f.original_context}},
                  false,
                  false,
                  name});
  return y;
}

}  // namespace engine::ops
