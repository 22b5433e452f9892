// MLP classifier: n_layer hidden layers of hidden_dim with an activation, then a linear head
// over num_classes, trained with softmax cross-entropy.
#include "linalg/linear.h"
#include "models/model.h"
#include "nn/activation.h"

namespace engine {

ModelGraph build_mlp(const recipe::Recipe& recipe, int64_t batch, double loss_scale) {
  const auto& m = recipe.model;
  ModelGraph model;
  Graph& g = model.graph;
  model.batch = batch;
  model.sequence = 1;
  model.classes = m.num_classes;
  model.inputs = g.add_input("features", Shape{batch, m.input_dim}, DType::f32);
  model.targets = g.add_input("targets", Shape{batch}, DType::i32);
  ValueId x = model.inputs;
  int64_t width = m.input_dim;
  for (int64_t l = 0; l < m.n_layer; ++l) {
    std::string p = "layers." + std::to_string(l);
    int unit = g.add_unit(p, true);
    ValueId w = g.add_param(p + ".weight", Shape{m.hidden_dim, width}, unit, ParamInit::normal(m.init_std), true);
    ValueId b = g.add_param(p + ".bias", Shape{m.hidden_dim}, unit, ParamInit::zeros(), false);
    x = ops::linear(g, x, w, b, p);
    switch (m.activation) {
      case recipe::Activation::relu:
        x = ops::relu(g, x, p + ".relu");
        break;
      case recipe::Activation::gelu:
        x = ops::gelu(g, x, p + ".gelu");
        break;
      case recipe::Activation::silu:
        x = ops::silu(g, x, p + ".silu");
        break;
    }
    width = m.hidden_dim;
  }
  int head = g.add_unit("head");
  ValueId w = g.add_param("head.weight", Shape{m.num_classes, width}, head, ParamInit::normal(m.init_std), true);
  ValueId b = g.add_param("head.bias", Shape{m.num_classes}, head, ParamInit::zeros(), false);
  finish_with_loss(model, x, w, b, loss_scale, "head");
  return model;
}

}  // namespace engine
