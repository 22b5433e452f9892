#include "graph/op.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/convert.h"

namespace engine {

namespace {

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

// Each distinct 16-bit value among the node's inputs and outputs, once (a value may be both). It
// runs for every node of every step, so it allocates nothing: nodes have a handful of values.
template <class Visit>
void for_each_16bit_value(const Graph& graph, const Node& node, Visit&& visit) {
  auto seen_before = [&](size_t position, ValueId id) {
    for (size_t p = 0; p < position; ++p)
      if ((p < node.inputs.size() ? node.inputs[p] : node.outputs[p - node.inputs.size()]) == id) return true;
    return false;
  };
  const size_t count = node.inputs.size() + node.outputs.size();
  for (size_t p = 0; p < count; ++p) {
    const ValueId id = p < node.inputs.size() ? node.inputs[p] : node.outputs[p - node.inputs.size()];
    if (is_16bit(graph.value(id).dtype) && !seen_before(p, id)) visit(id);
  }
}

}  // namespace

bool writes(const Node& node, ValueId value) {
  for (ValueId v : node.outputs)
    if (v == value) return true;
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i] == value && overwrites_input(node, i)) return true;
  return false;
}

bool needs_conversion(const Graph& graph, const Node& node, Device::Kind device) {
  DType type = DType::f32;
  for_each_16bit_value(graph, node, [&](ValueId id) { type = graph.value(id).dtype; });
  if (type == DType::f32) return false;
  if (device == Device::Kind::cuda)
    return node.op->cuda_16bit_for ? !node.op->cuda_16bit_for(graph, node) : !node.op->cuda_16bit;
  return !node.op->native_16bit || (node.op->native_for && !node.op->native_for(type));
}

int64_t conversion_bytes(const Graph& graph, const Node& node, Device::Kind device) {
  if (!needs_conversion(graph, node, device)) return 0;
  int64_t bytes = 0;
  for_each_16bit_value(graph, node, [&](ValueId id) { bytes += arena_aligned(graph.value(id).shape.numel() * 4); });
  return bytes;
}

// out (+)= in, element for element, in whatever types the two values are stored.
void copy_kernel(const Node& node, const KernelContext& ctx) {
  const ValueId in = node.inputs[0], out = node.outputs[0];
  const DType from = ctx.dtype(in), to = ctx.dtype(out);
  const int64_t n = ctx.shape(in).numel();
  const bool accumulate = ctx.accumulates(node, 0);
  if (from == to && !accumulate) {
    // In blocks across the threads: one core copies at about half the machine's bandwidth.
    const int64_t bytes = n * int64_t(dtype_size(from));
    constexpr int64_t kCopyBlock = int64_t(1) << 16;
    const auto* src = static_cast<const std::byte*>(ctx.data(in));
    auto* dst = static_cast<std::byte*>(ctx.data(out));
#pragma omp parallel for schedule(static) if (bytes > 4 * kCopyBlock)
    for (int64_t begin = 0; begin < bytes; begin += kCopyBlock)
      std::memcpy(dst + begin, src + begin, size_t(std::min(kCopyBlock, bytes - begin)));
    return;
  }
  if (to == DType::f32) return widen(ctx.data(in), from, ctx.f32(out), n, accumulate);
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static) if (n > kSerialElements)
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    float chunk[kChunk];
    const int64_t count = std::min(kChunk, n - begin);
    const auto* src = static_cast<const std::byte*>(ctx.data(in)) + begin * int64_t(dtype_size(from));
    auto* dst = static_cast<std::byte*>(ctx.data(out)) + begin * int64_t(dtype_size(to));
    widen_serial(src, from, chunk, count);  // serial: this loop is the parallel one
    if (accumulate) widen_serial(dst, to, chunk, count, true);
    narrow_serial(chunk, dst, to, count);
  }
}

}  // namespace engine
