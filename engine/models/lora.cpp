#include "models/lora.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "linalg/linear.h"
#include "nn/dropout.h"
#include "parallel/tensor_parallel.h"
#include "recipe/lora_targets.h"
#include "shape/columns.h"

namespace engine {

Lora::Lora(Graph& graph, const recipe::Recipe& recipe, TensorLayout tensor)
    : graph_(graph), tensor_(tensor), rank_(recipe.lora.rank) {
  if (rank_ == 0) return;
  scale_ = recipe.lora.alpha / double(rank_);
  dropout_ = recipe.lora.dropout;
  std::string problem;
  targets_ = recipe::lora_targets(recipe.model.arch, recipe.lora.target_modules, &problem);
  if (targets_.empty()) throw UserError(problem);
}

ValueId Lora::weight(const std::string& name, Shape shape, int unit, ParamInit init, bool decay) {
  if (enabled()) return graph_.add_frozen(name, std::move(shape), init);
  return graph_.add_param(name, std::move(shape), unit, init, decay);
}

bool Lora::targets(const std::string& module) const {
  return enabled() && std::find(targets_.begin(), targets_.end(), module) != targets_.end();
}

// y + scale * low B^T on y's columns from `offset`.
ValueId Lora::add(ValueId y, ValueId low, ValueId b, int64_t offset, const std::string& name) {
  ValueId update = ops::linear(graph_, low, b, kNoValue, name + ".lora_B");
  return ops::add_columns(graph_, y, update, offset, scale_, name + ".lora");
}

ValueId Lora::adapt(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t offset,
                    int64_t width, int unit, std::vector<std::pair<int64_t, int64_t>> blocks) {
  if (!targets(module)) return y;
  const std::string name = prefix + module;
  const int64_t in = graph_.value(x).shape.last(), split = tensor_.size;
  ValueId a = graph_.add_param(name + ".lora_A.weight", Shape{rank_, in}, unit,
                               ParamInit::uniform(1.0 / std::sqrt(double(in))));
  ValueId b = graph_.add_param(name + ".lora_B.weight", Shape{width / split, rank_}, unit, ParamInit::zeros());
  if (split > 1) {
    if (blocks.empty()) blocks = {{0, width}};
    graph_.set_slice(
        b, TensorSlice{.logical = Shape{width, rank_}, .blocks = blocks, .rank = tensor_.rank, .size = tensor_.size});
  }
  ValueId input = dropout_ > 0 ? ops::dropout(graph_, x, dropout_, name + ".lora_dropout") : x;
  ValueId low = ops::linear(graph_, input, a, kNoValue, name + ".lora_A");
  if (split > 1) low = ops::copy_to_tensor_group(graph_, low, name + ".lora_A.tensor_copy");
  return add(y, low, b, offset / split, name);
}

ValueId Lora::adapt_row(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t width,
                        int unit) {
  if (!targets(module)) return y;
  const std::string name = prefix + module;
  const int64_t split = tensor_.size, in = graph_.value(x).shape.last() * split;
  ValueId a = graph_.add_param(name + ".lora_A.weight", Shape{rank_, in / split}, unit,
                               ParamInit::uniform(1.0 / std::sqrt(double(in))));
  ValueId b = graph_.add_param(name + ".lora_B.weight", Shape{width, rank_}, unit, ParamInit::zeros());
  ValueId input = x;
  if (split > 1) {
    const TensorSlice slice{
        .logical = Shape{rank_, in}, .by_columns = true, .blocks = {}, .rank = tensor_.rank, .size = tensor_.size};
    graph_.set_slice(a, slice);
    if (dropout_ > 0)
      input = ops::dropout_columns(graph_, x, dropout_, in, slice.column_begin(), name + ".lora_dropout");
  } else if (dropout_ > 0) {
    input = ops::dropout(graph_, x, dropout_, name + ".lora_dropout");
  }
  ValueId low = ops::linear(graph_, input, a, kNoValue, name + ".lora_A");
  if (split > 1) low = ops::reduce_from_tensor_group(graph_, low, kNoValue, name + ".lora_A.tensor_reduce");
  return add(y, low, b, 0, name);
}

}  // namespace engine
