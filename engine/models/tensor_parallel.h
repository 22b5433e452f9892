// Tensor parallelism in the model builders (Megatron-LM's layout): rank r of a group of T holds
//   column-parallel weights  its 1/T of the output rows of each block of rows (GPT's c_attn and
//                            Llama's qkv_proj: of q, of k and of v, so whole heads, grouped-query ones
//                            included), with their biases: the first MLP matrices too;
//   row-parallel weights     its 1/T of the input columns (the attention and MLP output projections),
//                            whose partial products one all-reduce sums, their biases added once after;
//   vocabulary-parallel      its 1/T of the embedding's rows (and of an untied LM head's), so the logits
//                            of a rank cover its slice of the vocabulary alone;
//   replicated weights       the rest (norms, GPT's position table, the row-parallel biases).
// Each split parameter records its TensorSlice (graph/graph.h) of the logical tensor: initialisation
// draws each logical element where the unsplit model does, so T ranks start from the one model.
// With T = 1 everything passes through: the graph is the unsplit one.
//
//   TensorParallel tp(g, TensorLayout{.size = 2, .rank = 1}, lora);
//   ValueId w = tp.column(p + "mlp.c_fc.weight", {{0, F}}, C, unit, ParamInit::normal(0.02));
//   ValueId h = tp.enter(layernorm(...), p + "mlp");               // f: gradient all-reduced
//   ValueId y = tp.leave(linear(gelu(linear(h, w, b)), w2, tp.split_bias(b2)), b2, p + "mlp");  // g
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "models/lora.h"
#include "models/model.h"
#include "recipe/recipe.h"

namespace engine {

class TensorParallel {
 public:
  // `lora` makes the weights (frozen ones with LoRA).
  TensorParallel(Graph& graph, TensorLayout layout, Lora& lora);
  bool enabled() const { return size_ > 1; }
  int64_t size() const { return size_; }
  int rank() const { return rank_; }

  // A logical (rows, columns) weight (columns 0: a vector of `rows`) whose row blocks [begin, end)
  // are each split evenly across the ranks.
  ValueId column(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& blocks, int64_t columns,
                 int unit, ParamInit init, bool decay = true);
  // A logical (rows, columns) weight whose columns are split.
  ValueId row(const std::string& name, int64_t rows, int64_t columns, int unit, ParamInit init, bool decay = true);
  // A weight every rank holds whole.
  ValueId whole(const std::string& name, Shape shape, int unit, ParamInit init, bool decay = true);
  // The first vocabulary row this rank's embedding and logits hold.
  int64_t vocab_begin(int64_t vocab) const { return vocab / size_ * rank_; }

  // Where a split region starts (f) and ends (g, adding `bias` after the sum); x itself when T = 1.
  ValueId enter(ValueId x, const std::string& name);
  ValueId leave(ValueId y, ValueId bias, const std::string& name);
  // The bias a row-parallel linear adds itself: none when split (leave() adds it), else `bias`.
  ValueId split_bias(ValueId bias) const { return enabled() ? kNoValue : bias; }

 private:
  Graph& graph_;
  int64_t size_ = 1;
  int rank_ = 0;
  Lora& lora_;
};

}  // namespace engine
