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
// Under tensor parallelism (models/tensor_parallel.h) an adapter splits with its layer, and its
// low-rank activation (B, S, rank) is what the group exchanges:
//   column-parallel layer  A whole, B's rows split as the layer's output rows are; A reads the
//                          replicated input before the group's copy (f), and its output passes f
//                          itself, so A's gradient sums every rank's part of the update's;
//   row-parallel layer     A's columns split as the layer's input columns are, B whole; A's partial
//                          products are summed (g), and the update is added after the layer's own sum.
// Dropout on a split input draws the unsplit input's mask (ops::dropout_columns).
//
//   Lora lora(g, recipe);
//   ValueId w = lora.weight("h.0.attn.c_attn.weight", Shape{3 * C, C}, unit, ParamInit::normal(0.02));
//   ValueId y = ops::linear(g, x, w, b, "h.0.attn.c_attn");
//   y = lora.adapt(y, x, "h.0.", "attn.c_attn", 0, 3 * C, unit);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "models/model.h"
#include "recipe/recipe.h"

namespace engine {

class Lora {
 public:
  Lora(Graph& graph, const recipe::Recipe& recipe, TensorLayout tensor = {});
  bool enabled() const { return rank_ > 0; }

  // A base weight: a parameter, or frozen when LoRA is on.
  ValueId weight(const std::string& name, Shape shape, int unit, ParamInit init, bool decay = true);
  // `y` (a linear layer's output, from input `x`) plus the adapter of `module` (its path within the
  // block, "self_attn.q_proj") on logical columns [offset, offset + width), when the recipe targets
  // it; otherwise `y` itself. `prefix` names the block ("model.layers.0."). Split, the layer is
  // column-parallel: `x` is the replicated input before the group's copy, and `blocks` (of the
  // adapter's own rows, [0, width) by default) split as the layer's rows are.
  ValueId adapt(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t offset,
                int64_t width, int unit, std::vector<std::pair<int64_t, int64_t>> blocks = {});
  // A row-parallel layer's adapter (every column of its output, `width`): `y` is the layer's output
  // after the group's sum, `x` this rank's columns of its input. Unsplit, the same as adapt().
  ValueId adapt_row(ValueId y, ValueId x, const std::string& prefix, const std::string& module, int64_t width,
                    int unit);

 private:
  bool targets(const std::string& module) const;
  ValueId add(ValueId y, ValueId low, ValueId b, int64_t offset, const std::string& name);

  Graph& graph_;
  TensorLayout tensor_;
  int64_t rank_ = 0;
  double scale_ = 1, dropout_ = 0;
  std::vector<std::string> targets_;
};

}  // namespace engine
