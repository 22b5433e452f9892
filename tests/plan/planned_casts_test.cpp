// Planned casts (runtime/planned_casts.h) around a kernel that throws: the context is left pointing
// at the values' own 16-bit memory, as the caller gave it, so that running the node again (the
// device runner's eager rerun after a failed CUDA graph capture) reads and writes the values, not
// the f32 scratch copies.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/buffer.h"
#include "runtime/planned_casts.h"

namespace engine {
namespace {

void throwing_kernel(const Node&, const KernelContext& ctx) {
  // The kernel sees f32 copies of both values ...
  if (ctx.dtype(ValueId(0)) != DType::f32 || ctx.dtype(ValueId(1)) != DType::f32)
    throw std::logic_error("the kernel was not given f32 copies");
  throw std::runtime_error("the launch failed");
}

void doubling_kernel(const Node& node, const KernelContext& ctx) {
  for (int i = 0; i < 4; ++i) ctx.f32(node.outputs[0])[i] = 2 * ctx.f32(node.inputs[0])[i];
}

const OpDef kF32Only{.name = "f32_only"};  // no 16-bit path: the executor converts around it

TEST(PlannedCasts, AKernelThatThrowsLeavesTheContextOnTheValuesOwnMemory) {
  Graph graph;
  const ValueId x = graph.add_activation("x", Shape{4}, DType::bf16);
  const ValueId y = graph.add_activation("y", Shape{4}, DType::bf16);
  Node node;
  node.op = &kF32Only;
  node.inputs = {x};
  node.outputs = {y};
  std::vector<uint16_t> x_bits(4, 0x3f80), y_bits(4, 0);  // bf16 1.0, 0.0
  KernelContext ctx;
  ctx.graph = &graph;
  ctx.pointers = {x_bits.data(), y_bits.data()};
  ctx.dtypes = {DType::bf16, DType::bf16};
  ASSERT_EQ(conversion_bytes(graph, node), 2 * kArenaAlignment);  // each copy at its own alignment
  Buffer scratch(conversion_bytes(graph, node));
  F32Copies copies;
  const auto widen_bf16 = [](const void* src, DType, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = uint32_t(static_cast<const uint16_t*>(src)[i]) << 16;
      std::memcpy(&dst[i], &bits, 4);
    }
  };
  const auto narrow_bf16 = [](const float* src, void* dst, DType, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &src[i], 4);
      static_cast<uint16_t*>(dst)[i] = uint16_t(bits >> 16);
    }
  };
  EXPECT_THROW(copies.run(graph, node, ctx, scratch.data(), throwing_kernel, widen_bf16, narrow_bf16),
               std::runtime_error);
  EXPECT_EQ(ctx.pointers[0], x_bits.data());
  EXPECT_EQ(ctx.pointers[1], y_bits.data());
  EXPECT_EQ(ctx.dtypes[0], DType::bf16);
  EXPECT_EQ(ctx.dtypes[1], DType::bf16);
  // ... and the same context runs the node again, into the value's own memory.
  copies.run(graph, node, ctx, scratch.data(), doubling_kernel, widen_bf16, narrow_bf16);
  EXPECT_EQ(y_bits, std::vector<uint16_t>(4, 0x4000));  // bf16 2.0
}

}  // namespace
}  // namespace engine
