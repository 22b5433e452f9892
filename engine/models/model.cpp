#include "models/model.h"

#include "linalg/linear.h"
#include "loss/cross_entropy.h"
#include "parallel/tensor_parallel.h"

namespace engine {

ModelGraph start_language_model(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, int64_t vocab) {
  ModelGraph model;
  model.batch = batch;
  model.sequence = sequence;
  model.classes = vocab;
  model.inputs = model.graph.add_input("tokens", Shape{batch, sequence}, DType::i32);
  model.targets = model.graph.add_input("targets", Shape{batch, sequence}, DType::i32);
  if (recipe.data.document_end)
    model.positions = model.graph.add_input("positions", Shape{batch, sequence}, DType::i32);
  return model;
}

void finish_with_loss(ModelGraph& model, ValueId x, ValueId head_weight, ValueId head_bias, double loss_scale,
                      const std::string& head_name, int64_t vocab_begin) {
  Graph& g = model.graph;
  model.logits = ops::linear(g, x, head_weight, head_bias, head_name);
  model.losses = vocab_begin >= 0
                     ? ops::vocab_cross_entropy(g, model.logits, model.targets, loss_scale, vocab_begin, "loss")
                     : ops::softmax_cross_entropy(g, model.logits, model.targets, loss_scale, "loss");
  g.set_loss(model.losses);
  g.mark_forward_end();
}

ModelGraph build_model(const recipe::Recipe& recipe, int64_t micro_batch, double loss_scale, TensorLayout tensor) {
  switch (recipe.model.arch) {
    case recipe::Arch::gpt:
      return build_gpt(recipe, micro_batch, *recipe.data.sequence_length, loss_scale, tensor);
    case recipe::Arch::llama:
      return build_llama(recipe, micro_batch, *recipe.data.sequence_length, loss_scale, tensor);
    case recipe::Arch::mlp:
      return build_mlp(recipe, micro_batch, loss_scale);
  }
  return {};
}

}  // namespace engine
