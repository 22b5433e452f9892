// Value binding: where a plan's replay finds each value. Activations sit at their plan offset in
// the arena; parameters, gradients, inputs and host values sit wherever the device keeps them,
// which `place(value, id)` says. The CPU executor and the CUDA runner differ only in that.
//
//   bind_values(graph, plan, arena.data(), ctx,
//               [&](const Value& v, ValueId id) { return v.placement == Placement::input ? ... : ...; });
#pragma once

#include <cstddef>

#include "graph/op.h"
#include "plan/plan.h"

namespace engine {

template <class Place>
void bind_values(const Graph& graph, const Plan& plan, std::byte* arena, KernelContext& ctx, Place&& place) {
  const size_t count = graph.values().size();
  ctx.pointers.assign(count, nullptr);
  ctx.dtypes.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const Value& v = graph.values()[i];
    ctx.dtypes[i] = v.dtype;
    if (v.placement != Placement::activation)
      ctx.pointers[i] = place(v, ValueId(i));
    else if (plan.offsets[i] >= 0)
      ctx.pointers[i] = arena + plan.offsets[i];
  }
}

}  // namespace engine
