// Llama: token embedding, pre-RMSNorm blocks of rotary causal self-attention (grouped-query when
// kv_heads < n_head) and a SwiGLU MLP, no biases (but q, k and v's with qkv_bias, as Qwen2), a
// final RMSNorm and an LM head (tied to the embedding when tie_embeddings).
//
// The q, k and v projections are one fused parameter, self_attn.qkv_proj.weight, rows
// [q (n_embd) | k (kv_heads x head_size) | v (kv_heads x head_size)], so a block runs one matmul
// for all three; checkpoint/weights.cpp splits it (and self_attn.qkv_proj.bias) into Hugging Face's
// q_proj, k_proj and v_proj.
#include <cmath>

#include "elementwise/add.h"
#include "linalg/linear.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/tensor_parallel.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/rotary.h"
#include "parallel/tensor_parallel.h"

namespace engine {

ModelGraph build_llama(const recipe::Recipe& recipe, int64_t batch, int64_t sequence, double loss_scale,
                       TensorLayout tensor) {
  const auto& m = recipe.model;
  const int64_t C = m.n_embd, V = m.vocab_size, L = m.n_layer, F = *m.ffn_dim;
  const int64_t KV = m.kv_heads.value_or(m.n_head), KVC = KV * (C / m.n_head);  // width of k and of v
  const double std = m.init_std, residual_std = m.init_std / std::sqrt(2.0 * double(L));
  ModelGraph model = start_language_model(recipe, batch, sequence, V);
  Graph& g = model.graph;
  Lora lora(g, recipe, tensor);        // with lora.rank > 0: every weight below frozen, adapters trained
  TensorParallel tp(g, tensor, lora);  // with T ranks: each holds its 1/T of the split layers
  const int64_t T = tp.size();
  auto norm_weight = [&](const std::string& name, int unit) {
    return tp.whole(name, Shape{C}, unit, ParamInit::ones(), false);
  };
  const ops::RopeFrequencies rope{
      .theta = m.rope_theta,
      .scaling = m.rope_scaling == recipe::RopeScalingType::linear   ? ops::RopeScaling::linear
                 : m.rope_scaling == recipe::RopeScalingType::llama3 ? ops::RopeScaling::llama3
                                                                     : ops::RopeScaling::none,
      .factor = m.rope_factor,
      .low_freq_factor = m.rope_low_freq_factor,
      .high_freq_factor = m.rope_high_freq_factor,
      .original_context = double(m.rope_original_context_length)};
  const std::vector<std::pair<int64_t, int64_t>> qkv_blocks{{0, C}, {C, C + KVC}, {C + KVC, C + 2 * KVC}},
      mlp_block{{0, F}};

  int embeddings = g.add_unit("embeddings");
  ValueId embed = tp.column("model.embed_tokens.weight", {{0, V}}, C, embeddings, ParamInit::normal(std));
  ValueId x = tp.enabled() ? tp.leave(ops::vocab_embedding(g, model.inputs, embed, kNoValue, "embeddings", kNoValue,
                                                           tp.vocab_begin(V), true),
                                      kNoValue, "embeddings")
                           : ops::embedding(g, model.inputs, embed, kNoValue, "embeddings");

  for (int64_t l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    int unit = g.add_unit("layers." + std::to_string(l), true);
    ValueId ln1 = norm_weight(p + "input_layernorm.weight", unit);
    ValueId qkv_w = tp.column(p + "self_attn.qkv_proj.weight", qkv_blocks, C, unit, ParamInit::normal(std));
    ValueId qkv_b = m.qkv_bias
                        ? tp.column(p + "self_attn.qkv_proj.bias", qkv_blocks, 0, unit, ParamInit::zeros(), false)
                        : kNoValue;
    ValueId o_w = tp.row(p + "self_attn.o_proj.weight", C, C, unit, ParamInit::normal(residual_std));
    ValueId ln2 = norm_weight(p + "post_attention_layernorm.weight", unit);
    ValueId gate_w = tp.column(p + "mlp.gate_proj.weight", mlp_block, C, unit, ParamInit::normal(std));
    ValueId up_w = tp.column(p + "mlp.up_proj.weight", mlp_block, C, unit, ParamInit::normal(std));
    ValueId down_w = tp.row(p + "mlp.down_proj.weight", C, F, unit, ParamInit::normal(residual_std));

    // An adapter of a column-parallel layer reads the normalised input before the group's copy.
    ValueId normed = ops::rmsnorm(g, x, ln1, m.norm_eps, p + "input_layernorm");
    ValueId h = tp.enter(normed, p + "self_attn");
    ValueId qkv = ops::linear(g, h, qkv_w, qkv_b, p + "self_attn.qkv_proj");
    qkv = lora.adapt(qkv, normed, p, "self_attn.q_proj", 0, C, unit);
    qkv = lora.adapt(qkv, normed, p, "self_attn.k_proj", C, KVC, unit);
    qkv = lora.adapt(qkv, normed, p, "self_attn.v_proj", C + KVC, KVC, unit);
    qkv = ops::rotary(g, qkv, m.n_head / T, rope, p + "self_attn.rotary", KV / T, model.positions);
    ValueId a = ops::causal_attention(g, qkv, m.n_head / T, p + "self_attn", KV / T, model.positions);
    ValueId o = tp.leave(ops::linear(g, a, o_w, kNoValue, p + "self_attn.o_proj"), kNoValue, p + "self_attn");
    x = ops::add(g, x, lora.adapt_row(o, a, p, "self_attn.o_proj", C, unit), p + "residual_1");
    normed = ops::rmsnorm(g, x, ln2, m.norm_eps, p + "post_attention_layernorm");
    h = tp.enter(normed, p + "mlp");
    ValueId gate =
        lora.adapt(ops::linear(g, h, gate_w, kNoValue, p + "mlp.gate_proj"), normed, p, "mlp.gate_proj", 0, F, unit);
    ValueId up = lora.adapt(ops::linear(g, h, up_w, kNoValue, p + "mlp.up_proj"), normed, p, "mlp.up_proj", 0, F, unit);
    ValueId f = ops::swiglu(g, gate, up, p + "mlp.swiglu");
    ValueId down = tp.leave(ops::linear(g, f, down_w, kNoValue, p + "mlp.down_proj"), kNoValue, p + "mlp");
    x = ops::add(g, x, lora.adapt_row(down, f, p, "mlp.down_proj", C, unit), p + "residual_2");
  }

  int head = g.add_unit("head");
  ValueId norm = norm_weight("model.norm.weight", head);
  ValueId lm_head = m.tie_embeddings ? embed : tp.column("lm_head.weight", {{0, V}}, C, head, ParamInit::normal(std));
  x = tp.enter(ops::rmsnorm(g, x, norm, m.norm_eps, "model.norm"), "lm_head");
  finish_with_loss(model, x, lm_head, kNoValue, loss_scale, "lm_head", tp.enabled() ? tp.vocab_begin(V) : -1);
  return model;
}

}  // namespace engine
