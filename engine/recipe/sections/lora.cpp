#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_lora(Schema& schema) {
  auto section = schema.section(
      "lora", &Recipe::lora,
      "Low-rank adapters (LoRA, as PEFT builds them): the model's weights are frozen (no gradients, no "
      "optimizer state) and each targeted linear layer trains a rank-r update (alpha / r) B A beside its "
      "weight. `engine export` writes the merged model or, with --adapter, a PEFT adapter (docs/lora.md).");
  section.key("rank", &LoraSection::rank)
      .def(0)
      .min(0)
      .limit(1 << 16)
      .help("The adapters' rank r; 0 trains the whole model without adapters.");
  section.key("alpha", &LoraSection::alpha)
      .def(8.0)
      .above(0)
      .help("The update's scale is alpha / rank (PEFT's lora_alpha).");
  section.key("dropout", &LoraSection::dropout)
      .def(0.0)
      .min(0)
      .below(1)
      .help("Dropout on each adapter's input (PEFT's lora_dropout); the frozen path sees the input as it is.");
  section.key("target_modules", &LoraSection::target_modules)
      .def(std::string("all-linear"))
      .help(
          "The linear layers that get adapters, by their Hugging Face module names, comma-separated: for "
          "llama q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; for gpt c_attn, c_proj, c_fc "
          "(attn.c_proj or mlp.c_proj for one of the two); or all-linear (every one of them, never the head).");
  section.key("init_from", &LoraSection::init_from)
      .must_exist()
      .or_directory()
      .derived_default("none: A uniform in +-1/sqrt(in), B zero, so training starts at the base model")
      .help(
          "Adapter weights to start from: a PEFT adapter directory (adapter_model.safetensors and "
          "adapter_config.json) or its safetensors file, relative to the recipe. Its rank and target modules "
          "must be this section's.");
}

}  // namespace engine::recipe
