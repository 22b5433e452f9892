#include "graph/wrap.h"

#include <vector>

#include "core/error.h"

namespace engine {

namespace {

// Consecutive runs of unit indices, one run per merged unit.
std::vector<std::vector<int>> group_units(const std::vector<Unit>& units, const WrapPolicySpec& spec) {
  std::vector<std::vector<int>> groups;
  int64_t filled = 0;
  for (int u = 0; u < int(units.size()); ++u) {
    const int64_t numel = units[size_t(u)].numel;
    const bool starts_new = groups.empty() || spec.kind == WrapPolicySpec::Kind::block ||
                            (spec.kind == WrapPolicySpec::Kind::size && filled + numel > spec.max_params);
    if (starts_new) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(u);
    filled += numel;
  }
  return groups;
}

}  // namespace

void apply_wrap_policy(Graph& graph, const WrapPolicySpec& spec) {
  ENGINE_CHECK(graph.forward_size() == graph.nodes().size(), "apply_wrap_policy runs before autodiff");
  ENGINE_CHECK(spec.kind != WrapPolicySpec::Kind::size || spec.max_params >= 1, "wrap size must be positive");
  const std::vector<Unit> old = graph.units();
  const std::vector<std::vector<int>> groups = group_units(old, spec);
  if (groups.size() == old.size()) return;  // nothing merges

  std::vector<Unit> merged;
  std::vector<int> new_unit(old.size());
  std::vector<int64_t> base(old.size());  // where each old unit starts in its merged unit
  for (const std::vector<int>& group : groups) {
    Unit unit;
    const std::string& first = old[size_t(group.front())].name;
    unit.name = group.size() == 1 ? first : first + "-" + old[size_t(group.back())].name;
    for (int u : group) {
      new_unit[size_t(u)] = int(merged.size());
      base[size_t(u)] = unit.numel;
      unit.numel += old[size_t(u)].numel;
      unit.block = unit.block || old[size_t(u)].block;
    }
    merged.push_back(std::move(unit));
  }
  for (Param& p : graph.mutable_params()) {
    p.offset += base[size_t(p.unit)];
    p.unit = new_unit[size_t(p.unit)];
  }
  for (Node& node : graph.mutable_nodes())
    if (node.unit >= 0) node.unit = new_unit[size_t(node.unit)];
  graph.mutable_units() = std::move(merged);
}

}  // namespace engine
