// Model weights to and from safetensors under Hugging Face names and layouts.
//
// Most parameters are stored as they are. Two kinds differ from the engine's own layout:
// - GPT-2's Hugging Face checkpoints store the four linear layers of a block (attn.c_attn,
//   attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights, (in, out); the engine stores every
//   linear weight (out, in), so those are transposed on the way in and out.
// - Llama's fused self_attn.qkv_proj.weight is three tensors in a file: self_attn.q_proj.weight
//   (n_embd, n_embd), k_proj and v_proj (kv_heads x head_size, n_embd each), its rows in that
//   order. No rotary permutation is needed: the engine rotates in Hugging Face's convention.
// Every file the engine writes under these names (final weights, `engine export`, the gradients of
// --dump-first-gradients) uses this one layout. Import checks that every tensor is present with the
// right shape and dtype (F32), and names any missing, unexpected or mis-shaped tensor; then that
// every value is finite, naming each tensor that holds a NaN or an infinity (a run from such weights
// diverges at its first step, far from the cause). It accepts
// Hugging Face's files as published: a "transformer." prefix and the attention-mask buffers
// (h.N.attn.bias, h.N.attn.masked_bias) of GPT-2, the rotary buffers of older Llama files
// (self_attn.rotary_emb.inv_freq), and an lm_head.weight when the head is tied to the embedding
// and the file's equals it (one that differs is an untied head: refused, naming tie_embeddings).
// Import reads a safetensors file or a Hugging Face model directory (model.safetensors, or the
// shards model.safetensors.index.json lists), in f32, bf16 or f16 (widened to f32), and names
// other formats (PyTorch's .bin/.pt, JSON) for what they are. Every file written carries the
// `format: pt` metadata transformers' from_pretrained requires.
//
//   save_weights("model.safetensors", store, recipe::Arch::llama, {{"steps", "100"}});
//   load_weights("hf/model.safetensors", store, recipe::Arch::llama);
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "graph/graph.h"
#include "recipe/recipe.h"
#include "runtime/parameters.h"

namespace engine {

// Every weight of the model, trained or frozen; a LoRA model's adapters under their own names
// (model.layers.0.self_attn.q_proj.lora_A.weight), beside the base weights.
void save_weights(const std::filesystem::path& path, const ParameterStore& store, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata);
// The same from any source of whole weights (`param(ref)`: the weight's fp32 values), such as the
// masters gathered from every rank's shard.
void save_weights(const std::filesystem::path& path, const Graph& graph, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata,
                  const std::function<const float*(Graph::WeightRef)>& param);
// A store's weights as save_weights reads them (frozen ones widened to fp32).
std::function<const float*(Graph::WeightRef)> store_weights(const ParameterStore& store);

// Loads every weight of the model from a file or model directory. A LoRA model's adapters are
// loaded when the file has them (a run's own weights) and keep their values when it has none (a
// Hugging Face model, the base alone). Returns whether it loaded adapters. `whole`: the whole model
// when the store holds one pipeline stage of it, whose other stages' tensors the file holds too.
bool load_weights(const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch,
                  const Graph* whole = nullptr);
enum class WeightSet { model, adapters };
// The same from tensors already read; `adapters`: the LoRA adapters alone (a PEFT adapter's file,
// its "base_model.model." prefix dropped), every one required.
bool load_weight_set(SafetensorsFile file, const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch,
                     WeightSet set, const Graph* whole = nullptr);
// Whether a tensor name is a LoRA adapter's (.lora_A. or .lora_B.).
bool is_adapter(const std::string& name);

// The config.json transformers' from_pretrained reads beside the weights, for a gpt (GPT2LMHeadModel)
// or llama model section (LlamaForCausalLM; Qwen2ForCausalLM with qkv_bias; MistralForCausalLM for
// a run that started from a Mistral); a UserError for what transformers' classes cannot express (an
// mlp, a GPT without biases). `dtype`: the weights' type, config.json's torch_dtype.
std::string hugging_face_config(const recipe::ModelSection& model, DType dtype = DType::f32);

// The file tensors, in Hugging Face's names and layouts, of one value per weight: `data(ref)` is
// the weight's values, or its gradient (fp32, the weight's shape).
std::vector<SafeTensor> hugging_face_tensors(const Graph& graph, recipe::Arch arch,
                                             const std::function<const float*(Graph::WeightRef)>& data);

}  // namespace engine
