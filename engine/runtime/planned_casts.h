// Planned casts: how a kernel that computes in f32 only (OpDef::native_16bit on the CPU,
// OpDef::cuda_16bit on CUDA, unset) runs on a node whose values are 16-bit. Each distinct 16-bit
// value gets an f32 copy in the scratch the plan sized (conversion_bytes): inputs, and outputs that
// accumulate, are widened first; outputs, and inputs the op overwrites (cross-entropy writes the
// logits' gradient over them), are rounded back after. The CPU executor and the CUDA runner differ
// only in how they widen and round, which they pass in.
//
//   F32Copies copies;   // one per executor: its list is reused, so a step allocates nothing
//   copies.run(graph, node, ctx, scratch, node.op->cpu,
//              [](const void* src, DType t, float* dst, int64_t n) { widen(src, t, dst, n); },
//              [](const float* src, void* dst, DType t, int64_t n) { narrow(src, dst, t, n); });
#pragma once

#include <cstddef>
#include <vector>

#include "graph/op.h"
#include "plan/plan.h"

namespace engine {

class F32Copies {
 public:
  template <class Widen, class Narrow>
  void run(const Graph& graph, const Node& node, KernelContext& ctx, std::byte* scratch, Kernel kernel, Widen&& widen,
           Narrow&& narrow) {
    slots_.clear();
    std::byte* next = scratch;
    auto copy = [&](ValueId id, bool round_back, bool load) {
      const DType type = graph.value(id).dtype;
      if (type != DType::bf16 && type != DType::f16) return;
      for (Slot& slot : slots_)
        if (slot.id == id) {
          slot.round_back = slot.round_back || round_back;
          return;
        }
      const int64_t n = graph.value(id).shape.numel();
      auto* f32 = reinterpret_cast<float*>(next);
      next += arena_aligned(n * 4);
      if (load) widen(ctx.pointers[size_t(id)], type, f32, n);
      slots_.push_back({id, ctx.pointers[size_t(id)], round_back});
      ctx.pointers[size_t(id)] = f32;
      ctx.dtypes[size_t(id)] = DType::f32;
    };
    // The context points at the values' own memory again after the kernel, and also where a
    // widening or the kernel throws (a caller may run the node again with it: a failed capture).
    const auto restore = [&] {
      for (const Slot& slot : slots_) {
        ctx.pointers[size_t(slot.id)] = slot.original;
        ctx.dtypes[size_t(slot.id)] = graph.value(slot.id).dtype;
      }
    };
    try {
      for (size_t i = 0; i < node.inputs.size(); ++i) copy(node.inputs[i], overwrites_input(node, i), true);
      for (size_t i = 0; i < node.outputs.size(); ++i) copy(node.outputs[i], true, ctx.accumulates(node, i));
      kernel(node, ctx);
    } catch (...) {
      restore();
      throw;
    }
    for (const Slot& slot : slots_) {
      const Value& v = graph.value(slot.id);
      if (slot.round_back)
        narrow(static_cast<const float*>(ctx.pointers[size_t(slot.id)]), slot.original, v.dtype, v.shape.numel());
    }
    restore();
  }

 private:
  struct Slot {
    ValueId id;
    void* original;   // the value's own 16-bit memory
    bool round_back;  // an output, or an input the op overwrites
  };
  std::vector<Slot> slots_;
};

}  // namespace engine
