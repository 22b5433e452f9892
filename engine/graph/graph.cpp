#include "graph/graph.h"

#include "core/error.h"

namespace engine {

namespace {

// Element counts are bounded (2^40) so byte sizes never overflow; recipes that ask for more get a
// user error naming the value.
void check_size(const std::string& name, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape.dims)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 40))
      throw UserError("value " + name + " " + shape.str() + " is too large (more than 2^40 elements)");
}

}  // namespace

int Graph::add_unit(std::string name, bool block) {
  units_.push_back({std::move(name), 0, block});
  return static_cast<int>(units_.size()) - 1;
}

ValueId Graph::add_param(std::string name, Shape shape, int unit, ParamInit init, bool decay) {
  check_size(name, shape);
  ENGINE_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()), "unknown unit");
  Param param{.name = name,
              .unit = unit,
              .offset = units_[static_cast<size_t>(unit)].numel,
              .init = init,
              .decay = decay,
              .slice = {}};
  units_[static_cast<size_t>(unit)].numel += shape.numel();
  int index = static_cast<int>(params_.size());
  values_.push_back({name, shape, DType::f32, Placement::parameter, index});
  param.value = static_cast<ValueId>(values_.size() - 1);
  values_.push_back({name + ".grad", shape, DType::f32, Placement::gradient, index});
  param.grad = static_cast<ValueId>(values_.size() - 1);
  weights_.push_back({false, index});
  params_.push_back(param);
  return param.value;
}

std::vector<std::pair<int64_t, int64_t>> TensorSlice::rows() const {
  if (by_columns) return {{0, logical_rows()}};
  std::vector<std::pair<int64_t, int64_t>> mine;
  for (auto [begin, end] : blocks) {
    const int64_t part = (end - begin) / size;
    mine.emplace_back(begin + part * rank, begin + part * (rank + 1));
  }
  return mine;
}

std::vector<int64_t> TensorSlice::row_list() const {
  std::vector<int64_t> list;
  for (auto [begin, end] : rows())
    for (int64_t row = begin; row < end; ++row) list.push_back(row);
  return list;
}

int64_t TensorSlice::numel() const {
  int64_t rows_held = 0;
  for (auto [begin, end] : rows()) rows_held += end - begin;
  return rows_held * columns();
}

void TensorSlice::take(const float* whole, float* part) const {
  const int64_t width = columns(), stride = logical_columns(), column = column_begin();
  for (auto [begin, end] : rows())
    for (int64_t row = begin; row < end; ++row, part += width)
      for (int64_t k = 0; k < width; ++k) part[k] = whole[row * stride + column + k];
}

void Graph::set_slice(ValueId value, TensorSlice slice) {
  const Value& v = values_[size_t(value)];
  ENGINE_CHECK(v.placement == Placement::parameter || v.placement == Placement::frozen,
               v.name + ": only a weight is split");
  ENGINE_CHECK(slice.numel() == v.shape.numel(), v.name + ": the slice does not make its shape");
  (v.placement == Placement::frozen ? frozen_ : params_)[size_t(v.param)].slice = std::move(slice);
}

ValueId Graph::add_frozen(std::string name, Shape shape, ParamInit init) {
  check_size(name, shape);
  const int index = static_cast<int>(frozen_.size());
  Param weight{.name = name, .unit = -1, .offset = frozen_numel_, .init = init, .decay = false, .slice = {}};
  frozen_numel_ += shape.numel();
  values_.push_back({std::move(name), std::move(shape), DType::f32, Placement::frozen, index});
  weight.value = static_cast<ValueId>(values_.size() - 1);
  weights_.push_back({true, index});
  frozen_.push_back(std::move(weight));
  return frozen_.back().value;
}

ValueId Graph::add_input(std::string name, Shape shape, DType dtype) {
  check_size(name, shape);
  values_.push_back({std::move(name), std::move(shape), dtype, Placement::input, -1});
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId Graph::add_activation(std::string name, Shape shape, DType dtype) {
  check_size(name, shape);
  values_.push_back({std::move(name), std::move(shape), dtype, Placement::activation, -1});
  return static_cast<ValueId>(values_.size() - 1);
}

void Graph::remove_nodes(const std::vector<bool>& removed) {
  std::vector<Node> kept;
  size_t forward = 0;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (n < removed.size() && removed[n]) continue;
    if (n < forward_size_) ++forward;
    kept.push_back(std::move(nodes_[n]));
  }
  nodes_ = std::move(kept);
  forward_size_ = forward;
}

void Graph::add_node(Node node) {
  ENGINE_CHECK(node.op != nullptr, "node without op");
  for (ValueId id : node.inputs) ENGINE_CHECK(id >= 0 && id < static_cast<ValueId>(values_.size()), "bad input");
  for (ValueId id : node.outputs) ENGINE_CHECK(id >= 0 && id < static_cast<ValueId>(values_.size()), "bad output");
  if (node.unit < 0 && !node.backward && forward_size_ == 0) node.unit = static_cast<int>(units_.size()) - 1;
  nodes_.push_back(std::move(node));
}

int64_t Graph::param_count() const {
  int64_t n = 0;
  for (const auto& unit : units_) n += unit.numel;
  return n;
}

}  // namespace engine
