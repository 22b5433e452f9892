#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "loss/cross_entropy.h"

namespace engine::ops {

namespace {

GroupCollectives& group(const Node& node, const KernelContext& ctx) {
  if (!ctx.tensor_group) throw UserError(node.name + ": a tensor-parallel op runs without a tensor-parallel group");
  return *ctx.tensor_group;
}

int64_t bytes_of(const KernelContext& ctx, ValueId id) {
  return ctx.shape(id).numel() * int64_t(dtype_size(ctx.dtype(id)));
}

// f backward: dx (+)= all_reduce(dy). dy is left as it is (another node may share it).
void all_reduce_gradient_cpu(const Node& node, const KernelContext& ctx) {
  const ValueId dy = node.inputs[0], dx = node.outputs[0];
  const DType type = ctx.dtype(dy);
  const int64_t n = ctx.shape(dy).numel();
  if (!ctx.accumulates(node, 0)) {
    std::memcpy(ctx.data(dx), ctx.data(dy), size_t(bytes_of(ctx, dy)));
    group(node, ctx).all_reduce(ctx.data(dx), n, type, "all-reduce of " + node.name + "'s input gradient");
    return;
  }
  std::vector<std::byte> reduced(size_t(bytes_of(ctx, dy)));
  std::memcpy(reduced.data(), ctx.data(dy), reduced.size());
  group(node, ctx).all_reduce(reduced.data(), n, type, "all-reduce of " + node.name + "'s input gradient");
  std::vector<float> sum(static_cast<size_t>(n)), part(static_cast<size_t>(n));
  widen(ctx.data(dx), type, sum.data(), n);
  widen(reduced.data(), type, part.data(), n);
  for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += part[size_t(i)];
  narrow(sum.data(), ctx.data(dx), type, n);
}

void copy_grad(GradBuilder& gb, const Node& node) {
  const ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue || !gb.wants(node.inputs[0])) return;
  GradBuilder::Target t = gb.target(node.inputs[0]);
  gb.emit(kTensorGroupAllReduce, {dy}, {t.value}, t, {}, node.name);
}

// g forward: y = all_reduce(x) (+ bias on every row).
void tensor_group_reduce_cpu(const Node& node, const KernelContext& ctx) {
  const ValueId x = node.inputs[0], y = node.outputs[0];
  const DType type = ctx.dtype(x);
  const int64_t n = ctx.shape(x).numel();
  std::memcpy(ctx.data(y), ctx.data(x), size_t(bytes_of(ctx, x)));
  group(node, ctx).all_reduce(ctx.data(y), n, type, "all-reduce of " + node.name + "'s partial sums");
  if (node.inputs.size() < 2) return;
  const ValueId b = node.inputs[1];
  const int64_t width = ctx.shape(b).numel(), rows = n / width;
  std::vector<float> bias(static_cast<size_t>(width));
  widen(ctx.data(b), ctx.dtype(b), bias.data(), width);
  if (type == DType::f32) {
    float* out = ctx.f32(y);
#pragma omp parallel for schedule(static) if (n > kSerialElements)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < width; ++c) out[r * width + c] += bias[size_t(c)];
    return;
  }
  auto* out = static_cast<std::byte*>(ctx.data(y));
#pragma omp parallel if (n > kSerialElements)
  {
    std::vector<float> row(static_cast<size_t>(width));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      std::byte* at = out + r * width * 2;
      widen_serial(at, type, row.data(), width);
      for (int64_t c = 0; c < width; ++c) row[size_t(c)] += bias[size_t(c)];
      narrow_serial(row.data(), at, type, width);
    }
  }
}

// db (+)= the sum of dy's rows (fp32 values; the executor widens 16-bit ones).
void bias_gradient_cpu(const Node& node, const KernelContext& ctx) {
  const float* dy = ctx.f32(node.inputs[0]);
  float* db = ctx.f32(node.outputs[0]);
  const int64_t width = ctx.shape(node.outputs[0]).numel(), rows = ctx.shape(node.inputs[0]).numel() / width;
  const bool accumulate = ctx.accumulates(node, 0);
#pragma omp parallel for schedule(static) if (rows * width > kSerialElements)
  for (int64_t c = 0; c < width; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += double(dy[r * width + c]);
    store(db + c, float(sum), accumulate);
  }
}

void tensor_group_reduce_grad(GradBuilder& gb, const Node& node) {
  const ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  gb.pass_through(node.inputs[0], dy, node.name);
  if (node.inputs.size() > 1 && gb.wants(node.inputs[1])) {
    GradBuilder::Target t = gb.target(node.inputs[1]);
    gb.emit(kBiasGradient, {dy}, {t.value}, t, {}, node.name + ".bias");
  }
}

// The vocabulary-parallel cross-entropy of rows [0, rows): see the header.
void vocab_cross_entropy_cpu(const Node& node, const KernelContext& ctx) {
  GroupCollectives& tensor = group(node, ctx);
  const Shape& ls = ctx.shape(node.inputs[0]);
  const int64_t rows = ls.rows(), vocab = ls.last(), begin = node.attrs.ints[0];
  const int32_t* targets = ctx.i32(node.inputs[1]);
  float* losses = ctx.f32(node.outputs[0]);
  const float scale = float(node.attrs.floats[0]) * ctx.loss_scale;
  const DType type = ctx.dtype(node.inputs[0]);
  auto* logits = static_cast<std::byte*>(ctx.data(node.inputs[0]));
  const int64_t element = int64_t(dtype_size(type));
  const bool parallel = rows > 1 && rows * vocab > kSerialElements;
  auto read_row = [&](int64_t r, float* into) { widen_serial(logits + r * vocab * element, type, into, vocab); };
  const int size = tensor.size();

  // 1. Each row's maximum over the whole vocabulary.
  std::vector<float> local_max(static_cast<size_t>(rows)), all_max(static_cast<size_t>(rows * size));
#pragma omp parallel if (parallel)
  {
    std::vector<float> z(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      read_row(r, z.data());
      local_max[size_t(r)] = *std::max_element(z.begin(), z.end());
    }
  }
  tensor.all_gather(local_max.data(), all_max.data(), rows * 4, "all-gather of " + node.name + "'s row maxima");
  std::vector<float> top(size_t(rows), -INFINITY);
  for (int rank = 0; rank < size; ++rank)
    for (int64_t r = 0; r < rows; ++r) top[size_t(r)] = std::max(top[size_t(r)], all_max[size_t(rank * rows + r)]);

  // 2. Each rank's sum of exponentials and, from the rank holding it, the target's logit.
  std::vector<double> local(size_t(rows * 2)), all(size_t(rows * 2 * size));
#pragma omp parallel if (parallel)
  {
    std::vector<float> z(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      read_row(r, z.data());
      const float shift = top[size_t(r)] == -INFINITY ? 0.0f : top[size_t(r)];
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(z[size_t(v)]) - double(shift));
      const int64_t target = int64_t(targets[r]) - begin;
      local[size_t(2 * r)] = sum;
      local[size_t(2 * r + 1)] = target >= 0 && target < vocab ? double(z[size_t(target)]) : 0.0;
    }
  }
  tensor.all_gather(local.data(), all.data(), rows * 16, "all-gather of " + node.name + "'s sums of exponentials");

  // 3. The losses, and the logits overwritten with scale * (softmax - onehot).
#pragma omp parallel if (parallel)
  {
    std::vector<float> z(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == kIgnoredTarget) {  // no loss, no gradient
        std::memset(logits + r * vocab * element, 0, size_t(vocab * element));
        losses[r] = 0.0f;
        continue;
      }
      double sum = 0, target_logit = 0;
      for (int rank = 0; rank < size; ++rank) {
        sum += all[size_t((rank * rows + r) * 2)];
        target_logit += all[size_t((rank * rows + r) * 2 + 1)];
      }
      const float shift = top[size_t(r)] == -INFINITY ? 0.0f : top[size_t(r)];
      const double log_sum = double(shift) + std::log(sum);
      losses[r] = float(log_sum - target_logit);
      read_row(r, z.data());
      for (int64_t v = 0; v < vocab; ++v) z[size_t(v)] = float(std::exp(double(z[size_t(v)]) - log_sum) * scale);
      const int64_t target = int64_t(targets[r]) - begin;
      if (target >= 0 && target < vocab) z[size_t(target)] -= scale;
      narrow_serial(z.data(), logits + r * vocab * element, type, vocab);
    }
  }
}

void vocab_cross_entropy_grad(GradBuilder& gb, const Node& node) {
  gb.pass_through(node.inputs[0], node.inputs[0], node.name);
}

void tensor_parallel_not_on_gpu(const Node& node, const KernelContext&) {
  throw UserError(node.name + ": tensor parallelism is not on the GPU yet");
}

}  // namespace

const OpDef kCopyToTensorGroup{.name = "copy_to_tensor_group",
                               .cpu = copy_kernel,
                               .cuda = tensor_parallel_not_on_gpu,
                               .grad = copy_grad,
                               .flops = [](const Graph&, const Node&) { return 0.0; },
                               .native_16bit = "16-bit values copied as they are",
                               .tensor_parallel = true};
const OpDef kTensorGroupAllReduce{.name = "tensor_group_all_reduce",
                                  .cpu = all_reduce_gradient_cpu,
                                  .cuda = tensor_parallel_not_on_gpu,
                                  .flops = elementwise_flops,
                                  .native_16bit = "16-bit gradients reduced in their type"};
const OpDef kReduceFromTensorGroup{.name = "reduce_from_tensor_group",
                                   .cpu = tensor_group_reduce_cpu,
                                   .cuda = tensor_parallel_not_on_gpu,
                                   .grad = tensor_group_reduce_grad,
                                   .flops = elementwise_flops,
                                   .native_16bit = "16-bit partial sums reduced in their type, the bias added in fp32",
                                   .tensor_parallel = true};
const OpDef kBiasGradient{
    .name = "bias_gradient",
    .cpu = bias_gradient_cpu,
    .cuda = tensor_parallel_not_on_gpu,
    .flops = [](const Graph& g, const Node& n) { return double(g.value(n.inputs[0]).shape.numel()); }};
const OpDef kVocabCrossEntropy{
    .name = "vocab_cross_entropy",
    .cpu = vocab_cross_entropy_cpu,
    .cuda = tensor_parallel_not_on_gpu,
    .grad = vocab_cross_entropy_grad,
    .flops = [](const Graph& g, const Node& n) { return 5.0 * double(g.value(n.inputs[0]).shape.numel()); },
    .native_16bit = "16-bit logits and their gradient, fp32 softmax and loss",
    .fp32_outputs = 0b1,
    .overwritten_inputs = 0b1};

ValueId copy_to_tensor_group(Graph& g, ValueId x, const std::string& name) {
  const Value& v = g.value(x);
  ValueId y = g.add_activation(name + ".out", v.shape, v.dtype);
  g.add_node(Node{&kCopyToTensorGroup, {x}, {y}, {}, false, false, name});
  return y;
}

ValueId reduce_from_tensor_group(Graph& g, ValueId x, ValueId bias, const std::string& name) {
  const Value& v = g.value(x);
  std::vector<ValueId> inputs{x};
  if (bias != kNoValue) {
    if (g.value(bias).shape.numel() != v.shape.last())
      shape_error(name, "bias " + g.value(bias).shape.str() + " does not match the output's width " + v.shape.str());
    inputs.push_back(bias);
  }
  ValueId y = g.add_activation(name + ".out", v.shape, v.dtype);
  g.add_node(Node{&kReduceFromTensorGroup, inputs, {y}, {}, false, false, name});
  return y;
}

ValueId vocab_cross_entropy(Graph& g, ValueId logits, ValueId targets, double scale, int64_t vocab_begin,
                            const std::string& name) {
  const Shape& ls = g.value(logits).shape;
  const Shape& ts = g.value(targets).shape;
  if (g.value(targets).dtype != DType::i32 || ts.numel() != ls.rows())
    shape_error(name, "targets " + ts.str() + " do not match logits " + ls.str());
  ValueId losses = g.add_activation(name + ".losses", Shape{ls.rows()});
  g.add_node(Node{&kVocabCrossEntropy, {logits, targets}, {losses}, Attrs{{vocab_begin}, {scale}}, false, false, name});
  return losses;
}

}  // namespace engine::ops
