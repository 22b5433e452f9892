// Model builders: a recipe's model section turned into a forward graph that ends in a loss.
//
// Builders emit nodes through the op builders and compute nothing; a shape mistake is reported
// here, naming the layer. Parameters are grouped into wrap units: the embeddings, one unit per
// transformer block (or MLP layer), and the final norm and head. Parameter names follow Hugging
// Face (GPT-2: `h.0.attn.c_attn.weight`; Llama: `model.layers.0.mlp.gate_proj.weight`), with one
// difference: linear weights are stored (out, in) as nn.Linear does.
//
//   ModelGraph model = build_model(recipe, /*micro_batch=*/8, /*loss_scale=*/1.0 / (8 * 64));
//   autodiff(model.graph);
#pragma once

#include <cstdint>

#include "graph/graph.h"
#include "recipe/recipe.h"

namespace engine {

struct ModelGraph {
  Graph graph;
  ValueId inputs = kNoValue;   // tokens (B, T) i32, or features (B, input_dim) f32 for mlp
  ValueId targets = kNoValue;  // (B, T) or (B) i32
  // (B, T) i32: each token's position within its document, when windows pack several
  // (data.document_end); kNoValue otherwise.
  ValueId positions = kNoValue;
  ValueId losses = kNoValue;  // per-row losses (B*T) or (B)
  ValueId logits = kNoValue;  // (B, T, V) or (B, classes); overwritten by the loss's gradient
  // A pipeline stage (models/pipeline_stage.h): the fp32 activation received from the stage before
  // (an input), the one handed to the stage after and its gradient received back (an input), and,
  // once differentiated, the received activation's gradient (what goes back). kNoValue elsewhere.
  ValueId stage_input = kNoValue, stage_output = kNoValue, stage_output_gradient = kNoValue;
  ValueId stage_input_gradient = kNoValue;
  int64_t batch = 0;
  int64_t sequence = 0;  // T for language models, 1 for mlp
  int64_t classes = 0;   // vocabulary or number of classes
};

// `loss_scale` multiplies each row's loss gradient: 1 / (rows per optimizer step).
// Tensor parallelism (models/tensor_parallel.h): the group's size and this rank's place in it. The
// default is the whole model in one process, whatever the recipe's distributed.tensor_parallel (what
// evaluation, generation and export build: a tensor-parallel run's weights file holds whole tensors).
struct TensorLayout {
  int size = 1;
  int rank = 0;
};

ModelGraph build_model(const recipe::Recipe& recipe, int64_t micro_batch, double loss_scale, TensorLayout tensor = {});

// Shared by the builders: a language model's token and target inputs (B, T), and its position ids
// when the recipe packs documents ...
ModelGraph start_language_model(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, int64_t vocab);
// ... and every model's end: logits = x W^T (+ b) through `head_name`, the per-row loss, and the
// mark that closes the forward graph. With `vocab_begin` >= 0 the head holds the vocabulary rows from
// there (tensor parallelism) and the loss is the vocabulary-parallel one.
void finish_with_loss(ModelGraph& model, ValueId x, ValueId head_weight, ValueId head_bias, double loss_scale,
                      const std::string& head_name, int64_t vocab_begin = -1);

ModelGraph build_gpt(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, double loss_scale,
                     TensorLayout tensor = {});
ModelGraph build_llama(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, double loss_scale,
                       TensorLayout tensor = {});
ModelGraph build_mlp(const recipe::Recipe& recipe, int64_t batch, double loss_scale);

}  // namespace engine
