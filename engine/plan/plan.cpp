#include "plan/plan.h"

#include "graph/op.h"

#include <algorithm>
#include <numeric>

namespace engine {

std::vector<size_t> forward_nodes(const Graph& graph) {
  // Training-only nodes a pass placed in the forward part (activation offloads) are skipped.
  std::vector<size_t> nodes;
  for (size_t i = 0; i < graph.forward_size(); ++i)
    if (!graph.nodes()[i].backward) nodes.push_back(i);
  return nodes;
}

std::vector<size_t> all_nodes(const Graph& graph) {
  std::vector<size_t> nodes(graph.nodes().size());
  std::iota(nodes.begin(), nodes.end(), size_t{0});
  return nodes;
}

Plan plan_step(const Graph& graph, std::vector<size_t> nodes, const std::vector<ValueId>& keep,
               const std::vector<LiveRange>& buffers) {
  const auto& values = graph.values();
  std::vector<int> first(values.size(), -1), last(values.size(), -1);
  for (size_t step = 0; step < nodes.size(); ++step) {
    const Node& node = graph.nodes()[nodes[step]];
    auto touch = [&](ValueId id) {
      auto i = size_t(id);
      if (values[i].placement != Placement::activation) return;
      if (first[i] < 0) first[i] = int(step);
      last[i] = int(step);
    };
    for (ValueId id : node.inputs) touch(id);
    for (ValueId id : node.outputs) touch(id);
  }

  for (ValueId id : keep)
    if (first[size_t(id)] >= 0) last[size_t(id)] = int(nodes.size());
  for (const LiveRange& range : buffers) {
    first[size_t(range.value)] = range.first;
    last[size_t(range.value)] = range.last;
  }

  // Greedy by size: the largest values are placed first, each at the lowest offset that does not
  // overlap a placed value whose live interval intersects its own.
  std::vector<size_t> order;
  for (size_t i = 0; i < values.size(); ++i)
    if (first[i] >= 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return value_bytes(values[a]) > value_bytes(values[b]); });

  Plan plan;
  for (size_t index : nodes)
    plan.scratch_bytes = std::max(plan.scratch_bytes, conversion_bytes(graph, graph.nodes()[index]));
  plan.nodes = std::move(nodes);
  plan.offsets.assign(values.size(), -1);
  struct Placed {
    int64_t offset, end;
    int first, last;
  };
  std::vector<Placed> placed;
  for (size_t i : order) {
    int64_t bytes = arena_aligned(value_bytes(values[i]));
    plan.unplaced_bytes += bytes;
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& p : placed)
      if (p.first <= last[i] && first[i] <= p.last) busy.emplace_back(p.offset, p.end);
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [start, end] : busy) {
      if (offset + bytes <= start) break;
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    placed.push_back({offset, offset + bytes, first[i], last[i]});
    plan.arena_bytes = std::max(plan.arena_bytes, offset + bytes);
  }
  return plan;
}

}  // namespace engine
