#include "graph/graph.h"

#include "core/error.h"

namespace engine {

int Graph::add_unit(std::string name) {
  units_.push_back({std::move(name), 0});
  return static_cast<int>(units_.size()) - 1;
}

ValueId Graph::add_param(std::string name, Shape shape, int unit, ParamInit init, bool decay) {
  ENGINE_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()), "unknown unit");
  Param param{name, kNoValue, kNoValue, unit, units_[static_cast<size_t>(unit)].numel, init, decay};
  units_[static_cast<size_t>(unit)].numel += shape.numel();
  int index = static_cast<int>(params_.size());
  values_.push_back({name, shape, DType::f32, Placement::parameter, index});
  param.value = static_cast<ValueId>(values_.size() - 1);
  values_.push_back({name + ".grad", shape, DType::f32, Placement::gradient, index});
  param.grad = static_cast<ValueId>(values_.size() - 1);
  params_.push_back(param);
  return param.value;
}

ValueId Graph::add_input(std::string name, Shape shape, DType dtype) {
  values_.push_back({std::move(name), std::move(shape), dtype, Placement::input, -1});
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId Graph::add_activation(std::string name, Shape shape, DType dtype) {
  values_.push_back({std::move(name), std::move(shape), dtype, Placement::activation, -1});
  return static_cast<ValueId>(values_.size() - 1);
}

void Graph::add_node(Node node) {
  ENGINE_CHECK(node.op != nullptr, "node without op");
  for (ValueId id : node.inputs) ENGINE_CHECK(id >= 0 && id < static_cast<ValueId>(values_.size()), "bad input");
  for (ValueId id : node.outputs) ENGINE_CHECK(id >= 0 && id < static_cast<ValueId>(values_.size()), "bad output");
  nodes_.push_back(std::move(node));
}

int64_t Graph::param_count() const {
  int64_t n = 0;
  for (const auto& unit : units_) n += unit.numel;
  return n;
}

}  // namespace engine
