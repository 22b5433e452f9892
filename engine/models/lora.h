// LoRA in the model builders: with lora.rank > 0 every base weight is frozen (Graph::add_frozen:
// read by the step, never trained) and each targeted linear layer gets an adapter, two trained
// parameters A (rank, in) and B (width, rank) in the block's wrap unit, whose update
//   (alpha / rank) * (dropout(x) A^T) B^T
// is added to the layer's output columns [offset, offset + width) (all of them, except where one
// fused projection holds several modules: Llama's q, k and v rows of qkv_proj). Names are PEFT's
// without its "base_model.model." prefix: model.layers.0.self_attn.q_proj.lora_A.weight. A starts
// uniform in +-1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5))), B at zero, so the first forward is
// the base model's.
//
//   Lora lora(g, recipe);
//   ValueId w = lora.weight("h.0.attn.c_attn.weight", Shape{3 * C, C}, unit, ParamInit::normal(0.02));
//   ValueId y = ops::linear(g, x, w, b, "h.0.attn.c_attn");
//   y = lora.adapt(y, x, "h.0.", "attn.c_attn", 0, 3 * C, unit);
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "recipe/recipe.h"

namespace engine {

class Lora {
 public:
  Lora(Graph& graph, const recipe::Recipe& recipe);
  bool enabled() const { return rank_ > 0; }

  // A base weight: a parameter, or frozen when LoRA is on.
  ValueId weight(const std::string& name, Shape shape, int unit, ParamInit init, bool decay = true);
  // `y` (a linear layer's output, from input `x`) plus the adapter of `module` (its path within the
  // block, "self_attn.q_proj") on columns [offset, offset + width), when the recipe targets it;
  // otherwise `y` itself. `prefix` names the block ("model.layers.0.").
  ValueId adapt(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t offset,
                int64_t width, int unit);

 private:
  Graph& graph_;
  int64_t rank_ = 0;
  double scale_ = 1, dropout_ = 0;
  std::vector<std::string> targets_;
};

}  // namespace engine
