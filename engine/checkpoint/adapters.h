// LoRA adapters in and out: PEFT's adapter files, and the merged model.
//
// A LoRA run's weights file holds the base weights under Hugging Face names and each adapter beside
// them (model.layers.0.self_attn.q_proj.lora_A.weight, .lora_B.weight), with the adapter settings in
// its metadata (lora_metadata). From those tensors, in the weights files' layout:
// - merge_adapters folds each adapter into its base weight, W += (alpha / rank) B A (transposed for
//   GPT-2's Conv1D weights, into q_proj, k_proj or v_proj for Llama), and drops the adapters: a plain
//   Hugging Face model.
// - peft_adapter keeps the adapters alone under PEFT's names (base_model.model.<module>.lora_A.weight)
//   with the adapter_config.json peft's PeftModel.from_pretrained reads.
//
//   auto tensors = hugging_face_tensors(graph, arch, store_weights(store));
//   merge_adapters(tensors, lora_settings(metadata));
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "recipe/recipe.h"
#include "runtime/parameters.h"

namespace engine {

struct LoraSettings {
  int64_t rank = 0;  // 0: not a LoRA model
  double alpha = 0, dropout = 0;
  std::vector<std::string> target_modules;  // PEFT's names, as the recipe lists them (resolved all-linear)
  recipe::Arch arch = recipe::Arch::gpt;
};

// The weights file metadata of a LoRA run, and back (rank 0 when the file has none).
std::map<std::string, std::string> lora_metadata(const recipe::Recipe& recipe);
LoraSettings lora_settings(const std::map<std::string, std::string>& metadata);

// Loads a PEFT adapter (its directory, or adapter_model.safetensors) into the store's adapters; the
// adapter_config.json beside it, when there is one, must give the recipe's rank and alpha.
// `whole`: the whole model when the store holds one pipeline stage of it (checkpoint/weights.h).
void load_adapters(const std::filesystem::path& path, ParameterStore& store, const recipe::Recipe& recipe,
                   const Graph* whole = nullptr);

// Folds every adapter into its base weight and removes the adapters (tensors in the weights files'
// names and layouts, fp32).
void merge_adapters(std::vector<SafeTensor>& tensors, const LoraSettings& lora);
// The adapters alone, under PEFT's names, and adapter_config.json's text.
std::vector<SafeTensor> peft_adapter_tensors(const std::vector<SafeTensor>& tensors, const LoraSettings& lora);
std::string peft_adapter_config(const LoraSettings& lora);

}  // namespace engine
