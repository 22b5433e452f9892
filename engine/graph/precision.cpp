#include "graph/precision.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "elementwise/cast.h"
#include "graph/op.h"

namespace engine {

void apply_precision(Graph& graph, DType compute, DType gradient_accumulation) {
  if (compute == DType::f32) return;
  ENGINE_CHECK(graph.forward_size() > 0 && graph.forward_size() == graph.nodes().size(),
               "apply_precision runs on a forward graph, before autodiff");
  for (const Param& p : graph.params()) {
    graph.mutable_value(p.value).dtype = compute;
    graph.mutable_value(p.grad).dtype = gradient_accumulation;
  }
  for (const Param& w : graph.frozen()) graph.mutable_value(w.value).dtype = compute;
  std::vector<Node> forward = graph.nodes();
  for (const Node& node : forward)
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      Value& v = graph.mutable_value(node.outputs[i]);
      if (v.placement == Placement::activation && v.dtype == DType::f32 && !(node.op->fp32_outputs & (1u << i)))
        v.dtype = compute;
    }
  // Float inputs (features) are cast once, at the start; their readers read the cast.
  std::vector<Node> casts;
  std::map<ValueId, ValueId> cast_of;
  for (size_t i = 0; i < graph.values().size(); ++i) {
    const Value& v = graph.values()[i];
    if (v.placement != Placement::input || v.dtype != DType::f32) continue;
    const bool read_as_is = std::all_of(forward.begin(), forward.end(), [&](const Node& node) {
      return node.op->any_float_inputs ||
             std::find(node.inputs.begin(), node.inputs.end(), ValueId(i)) == node.inputs.end();
    });
    if (read_as_is) continue;
    ValueId cast = graph.add_activation(v.name + "." + std::string(dtype_name(compute)), v.shape, compute);
    casts.push_back(Node{&ops::kCast, {ValueId(i)}, {cast}, {}, false, false, v.name, -1});
    cast_of[ValueId(i)] = cast;
  }
  for (Node& node : forward)
    for (ValueId& in : node.inputs)
      if (auto it = cast_of.find(in); it != cast_of.end()) in = it->second;
  casts.insert(casts.end(), forward.begin(), forward.end());
  graph.mutable_nodes() = std::move(casts);
  graph.set_forward_size(graph.nodes().size());
}

std::string precision_table(const Graph& graph, const std::vector<size_t>& nodes) {
  struct Row {
    int count = 0;
    std::set<std::string> stored, kept_fp32;
    std::string compute;
  };
  std::map<std::string, Row> rows;
  std::vector<std::string> order;
  for (size_t index : nodes) {
    const Node& node = graph.nodes()[index];
    auto [it, inserted] = rows.try_emplace(node.op->name);
    if (inserted) order.push_back(node.op->name);
    Row& row = it->second;
    ++row.count;
    DType sixteen = DType::f32;
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const Value& v = graph.value(node.outputs[i]);
      if (!is_floating(v.dtype)) continue;
      row.stored.insert(std::string(dtype_name(v.dtype)));
      if (v.dtype != DType::f32) sixteen = v.dtype;
      if (node.op->fp32_outputs & (1u << i)) {
        std::string name = v.name.substr(0, v.name.find('@'));
        name = name.substr(name.rfind('.') + 1);
        row.kept_fp32.insert(name);
      }
    }
    for (ValueId in : node.inputs)
      if (graph.value(in).dtype == DType::bf16 || graph.value(in).dtype == DType::f16) sixteen = graph.value(in).dtype;
    if (sixteen == DType::f32)
      row.compute = "fp32";
    else if (!needs_conversion(graph, node))
      row.compute = node.op->native_16bit;
    else if (node.op->native_16bit && node.op->native_for)  // a 16-bit kernel this CPU lacks
      row.compute = "fp32 on widened " + std::string(dtype_name(sixteen)) +
                    " copies (not on this CPU: " + node.op->native_16bit + ")";
    else
      row.compute = "fp32 on widened " + std::string(dtype_name(sixteen)) + " copies";
  }
  std::ostringstream out;
  for (const std::string& name : order) {
    const Row& row = rows[name];
    std::string stored;
    for (const auto& s : row.stored) stored += (stored.empty() ? "" : "+") + s;
    std::string kept;
    for (const auto& k : row.kept_fp32) kept += (kept.empty() ? "" : ", ") + k;
    char line[256];
    std::snprintf(line, sizeof line, "  %-27s %4d  %-9s %s%s\n", name.c_str(), row.count,
                  stored.empty() ? "-" : stored.c_str(), row.compute.c_str(),
                  kept.empty() ? "" : ("; fp32 " + kept).c_str());
    out << line;
  }
  return out.str();
}

}  // namespace engine
