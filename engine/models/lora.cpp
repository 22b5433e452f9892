#include "models/lora.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "linalg/linear.h"
#include "nn/dropout.h"
#include "recipe/lora_targets.h"
#include "shape/columns.h"

namespace engine {

Lora::Lora(Graph& graph, const recipe::Recipe& recipe) : graph_(graph), rank_(recipe.lora.rank) {
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

ValueId Lora::adapt(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t offset,
                    int64_t width, int unit) {
  if (!enabled() || std::find(targets_.begin(), targets_.end(), module) == targets_.end()) return y;
  const std::string name = prefix + module;
  const int64_t in = graph_.value(x).shape.last();
  ValueId a = graph_.add_param(name + ".lora_A.weight", Shape{rank_, in}, unit,
                               ParamInit::uniform(1.0 / std::sqrt(double(in))));
  ValueId b = graph_.add_param(name + ".lora_B.weight", Shape{width, rank_}, unit, ParamInit::zeros());
  ValueId input = dropout_ > 0 ? ops::dropout(graph_, x, dropout_, name + ".lora_dropout") : x;
  ValueId low = ops::linear(graph_, input, a, kNoValue, name + ".lora_A");
  ValueId update = ops::linear(graph_, low, b, kNoValue, name + ".lora_B");
  return ops::add_columns(graph_, y, update, offset, scale_, name + ".lora");
}

}  // namespace engine
