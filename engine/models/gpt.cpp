// GPT-2: token + learned position embeddings, pre-LayerNorm blocks of causal self-attention and a
// GELU MLP, a final LayerNorm, and an LM head tied to the token embedding (unless untied).
#include <cmath>

#include "core/error.h"
#include "elementwise/add.h"
#include "linalg/linear.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/tensor_parallel.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "parallel/tensor_parallel.h"

namespace engine {

ModelGraph build_gpt(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, double loss_scale,
                     TensorLayout tensor) {
  const auto& m = recipe.model;
  const int64_t C = m.n_embd, V = m.vocab_size, L = m.n_layer, F = *m.ffn_dim;
  const double std = m.init_std, residual_std = m.init_std / std::sqrt(2.0 * double(L));
  ModelGraph model = start_language_model(recipe, batch, sequence, V);
  Graph& g = model.graph;
  Lora lora(g, recipe, tensor);        // with lora.rank > 0: every weight below frozen, adapters trained
  TensorParallel tp(g, tensor, lora);  // with T ranks: each holds its 1/T of the split layers
  const int64_t T = tp.size();

  auto weight = [&](const std::string& name, Shape shape, int unit, double s) {
    return tp.whole(name, std::move(shape), unit, ParamInit::normal(s), true);
  };
  auto bias = [&](const std::string& name, int64_t n, int unit) {
    return m.bias ? tp.whole(name, Shape{n}, unit, ParamInit::zeros(), false) : kNoValue;
  };
  auto column_bias = [&](const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& blocks, int unit) {
    return m.bias ? tp.column(name, blocks, 0, unit, ParamInit::zeros(), false) : kNoValue;
  };
  auto norm_weight = [&](const std::string& name, int64_t n, int unit) {
    return tp.whole(name, Shape{n}, unit, ParamInit::ones(), false);
  };
  const std::vector<std::pair<int64_t, int64_t>> qkv_blocks{{0, C}, {C, 2 * C}, {2 * C, 3 * C}}, mlp_block{{0, F}};

  int embeddings = g.add_unit("embeddings");
  ValueId wte = tp.column("wte.weight", {{0, V}}, C, embeddings, ParamInit::normal(std));
  ValueId wpe = weight("wpe.weight", Shape{m.context_length, C}, embeddings, std);
  ValueId x = tp.enabled() ? tp.leave(ops::vocab_embedding(g, model.inputs, wte, wpe, "embeddings", model.positions,
                                                           tp.vocab_begin(V), tp.rank() == 0),
                                      kNoValue, "embeddings")
                           : ops::embedding(g, model.inputs, wte, wpe, "embeddings", model.positions);
  x = ops::dropout(g, x, m.dropout, "embeddings.dropout");

  for (int64_t l = 0; l < L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    int unit = g.add_unit("h." + std::to_string(l), true);
    ValueId ln1_w = norm_weight(p + "ln_1.weight", C, unit), ln1_b = bias(p + "ln_1.bias", C, unit);
    ValueId attn_w = tp.column(p + "attn.c_attn.weight", qkv_blocks, C, unit, ParamInit::normal(std));
    ValueId attn_b = column_bias(p + "attn.c_attn.bias", qkv_blocks, unit);
    ValueId proj_w = tp.row(p + "attn.c_proj.weight", C, C, unit, ParamInit::normal(residual_std));
    ValueId proj_b = bias(p + "attn.c_proj.bias", C, unit);
    ValueId ln2_w = norm_weight(p + "ln_2.weight", C, unit), ln2_b = bias(p + "ln_2.bias", C, unit);
    ValueId fc_w = tp.column(p + "mlp.c_fc.weight", mlp_block, C, unit, ParamInit::normal(std));
    ValueId fc_b = column_bias(p + "mlp.c_fc.bias", mlp_block, unit);
    ValueId out_w = tp.row(p + "mlp.c_proj.weight", C, F, unit, ParamInit::normal(residual_std));
    ValueId out_b = bias(p + "mlp.c_proj.bias", C, unit);

    // An adapter of a column-parallel layer reads the normalised input before the group's copy.
    ValueId ln = ops::layernorm(g, x, ln1_w, ln1_b, m.norm_eps, p + "ln_1");
    ValueId h = tp.enter(ln, p + "attn");
    ValueId qkv = lora.adapt(ops::linear(g, h, attn_w, attn_b, p + "attn.c_attn"), ln, p, "attn.c_attn", 0, 3 * C, unit,
                             qkv_blocks);
    ValueId a = ops::causal_attention(g, qkv, m.n_head / T, p + "attn", 0, model.positions);
    ValueId proj = tp.leave(ops::linear(g, a, proj_w, tp.split_bias(proj_b), p + "attn.c_proj"), proj_b, p + "attn");
    proj = lora.adapt_row(proj, a, p, "attn.c_proj", C, unit);
    proj = ops::dropout(g, proj, m.dropout, p + "attn.dropout");
    x = ops::add(g, x, proj, p + "residual_1");
    ln = ops::layernorm(g, x, ln2_w, ln2_b, m.norm_eps, p + "ln_2");
    h = tp.enter(ln, p + "mlp");
    ValueId fc = lora.adapt(ops::linear(g, h, fc_w, fc_b, p + "mlp.c_fc"), ln, p, "mlp.c_fc", 0, F, unit);
    ValueId f = ops::gelu(g, fc, p + "mlp.gelu");
    ValueId o = tp.leave(ops::linear(g, f, out_w, tp.split_bias(out_b), p + "mlp.c_proj"), out_b, p + "mlp");
    o = lora.adapt_row(o, f, p, "mlp.c_proj", C, unit);
    o = ops::dropout(g, o, m.dropout, p + "mlp.dropout");
    x = ops::add(g, x, o, p + "residual_2");
  }

  int head = g.add_unit("head");
  ValueId lnf_w = norm_weight("ln_f.weight", C, head), lnf_b = bias("ln_f.bias", C, head);
  ValueId lm_head = m.tie_embeddings ? wte : tp.column("lm_head.weight", {{0, V}}, C, head, ParamInit::normal(std));
  x = tp.enter(ops::layernorm(g, x, lnf_w, lnf_b, m.norm_eps, "ln_f"), "lm_head");
  finish_with_loss(model, x, lm_head, kNoValue, loss_scale, "lm_head", tp.enabled() ? tp.vocab_begin(V) : -1);
  return model;
}

}  // namespace engine
