// GPT-2: token + learned position embeddings, pre-LayerNorm blocks of causal self-attention and a
// GELU MLP, a final LayerNorm, and an LM head tied to the token embedding (unless untied).
#include <cmath>

#include "core/error.h"
#include "elementwise/add.h"
#include "linalg/linear.h"
#include "models/lora.h"
#include "models/model.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"

namespace engine {

ModelGraph build_gpt(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, double loss_scale) {
  const auto& m = recipe.model;
  const int64_t C = m.n_embd, V = m.vocab_size, L = m.n_layer, F = *m.ffn_dim;
  const double std = m.init_std, residual_std = m.init_std / std::sqrt(2.0 * double(L));
  ModelGraph model = start_language_model(recipe, batch, sequence, V);
  Graph& g = model.graph;
  Lora lora(g, recipe);  // with lora.rank > 0: every weight below frozen, adapters trained

  auto weight = [&](const std::string& name, Shape shape, int unit, double s) {
    return lora.weight(name, std::move(shape), unit, ParamInit::normal(s), true);
  };
  auto bias = [&](const std::string& name, int64_t n, int unit) {
    return m.bias ? lora.weight(name, Shape{n}, unit, ParamInit::zeros(), false) : kNoValue;
  };
  auto norm_weight = [&](const std::string& name, int64_t n, int unit) {
    return lora.weight(name, Shape{n}, unit, ParamInit::ones(), false);
  };

  int embeddings = g.add_unit("embeddings");
  ValueId wte = weight("wte.weight", Shape{V, C}, embeddings, std);
  ValueId wpe = weight("wpe.weight", Shape{m.context_length, C}, embeddings, std);
  ValueId x = ops::dropout(g, ops::embedding(g, model.inputs, wte, wpe, "embeddings", model.positions), m.dropout,
                           "embeddings.dropout");

  for (int64_t l = 0; l < L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    int unit = g.add_unit("h." + std::to_string(l), true);
    ValueId ln1_w = norm_weight(p + "ln_1.weight", C, unit), ln1_b = bias(p + "ln_1.bias", C, unit);
    ValueId attn_w = weight(p + "attn.c_attn.weight", Shape{3 * C, C}, unit, std);
    ValueId attn_b = bias(p + "attn.c_attn.bias", 3 * C, unit);
    ValueId proj_w = weight(p + "attn.c_proj.weight", Shape{C, C}, unit, residual_std);
    ValueId proj_b = bias(p + "attn.c_proj.bias", C, unit);
    ValueId ln2_w = norm_weight(p + "ln_2.weight", C, unit), ln2_b = bias(p + "ln_2.bias", C, unit);
    ValueId fc_w = weight(p + "mlp.c_fc.weight", Shape{F, C}, unit, std);
    ValueId fc_b = bias(p + "mlp.c_fc.bias", F, unit);
    ValueId out_w = weight(p + "mlp.c_proj.weight", Shape{C, F}, unit, residual_std);
    ValueId out_b = bias(p + "mlp.c_proj.bias", C, unit);

    ValueId h = ops::layernorm(g, x, ln1_w, ln1_b, m.norm_eps, p + "ln_1");
    ValueId qkv = lora.adapt(ops::linear(g, h, attn_w, attn_b, p + "attn.c_attn"), h, p, "attn.c_attn", 0, 3 * C, unit);
    ValueId a = ops::causal_attention(g, qkv, m.n_head, p + "attn", 0, model.positions);
    ValueId proj = lora.adapt(ops::linear(g, a, proj_w, proj_b, p + "attn.c_proj"), a, p, "attn.c_proj", 0, C, unit);
    proj = ops::dropout(g, proj, m.dropout, p + "attn.dropout");
    x = ops::add(g, x, proj, p + "residual_1");
    h = ops::layernorm(g, x, ln2_w, ln2_b, m.norm_eps, p + "ln_2");
    ValueId fc = lora.adapt(ops::linear(g, h, fc_w, fc_b, p + "mlp.c_fc"), h, p, "mlp.c_fc", 0, F, unit);
    ValueId f = ops::gelu(g, fc, p + "mlp.gelu");
    ValueId o = lora.adapt(ops::linear(g, f, out_w, out_b, p + "mlp.c_proj"), f, p, "mlp.c_proj", 0, C, unit);
    o = ops::dropout(g, o, m.dropout, p + "mlp.dropout");
    x = ops::add(g, x, o, p + "residual_2");
  }

  int head = g.add_unit("head");
  ValueId lnf_w = norm_weight("ln_f.weight", C, head), lnf_b = bias("ln_f.bias", C, head);
  ValueId lm_head = m.tie_embeddings ? wte : weight("lm_head.weight", Shape{V, C}, head, std);
  x = ops::layernorm(g, x, lnf_w, lnf_b, m.norm_eps, "ln_f");
  finish_with_loss(model, x, lm_head, kNoValue, loss_scale, "lm_head");
  return model;
}

}  // namespace engine
