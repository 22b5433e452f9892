#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_model(Schema& schema) {
  const std::vector<std::string> transformers{"gpt", "llama"};
  auto model = schema.section("model", &Recipe::model, "The network to train.");
  model.key("arch", &ModelSection::arch)
      .choices({{"gpt", Arch::gpt}, {"llama", Arch::llama}, {"mlp", Arch::mlp}})
      .required()
      .help(
          "Architecture: gpt (GPT-2: learned positions, LayerNorm, GELU), llama (RMSNorm, rotary, "
          "SwiGLU, no biases) or mlp (a classifier).");
  model.key("vocab_size", &ModelSection::vocab_size)
      .def(50257)
      .min(2)
      .only_when("arch", transformers)
      .unit("tokens")
      .limit(1 << 24)
      .help("Size of the token vocabulary.");
  model.key("context_length", &ModelSection::context_length)
      .def(1024)
      .min(1)
      .only_when("arch", transformers)
      .unit("tokens")
      .limit(1 << 24)
      .help("Longest sequence the model accepts (the number of learned positions for gpt).");
  model.key("n_layer", &ModelSection::n_layer)
      .def(12)
      .min(1)
      .limit(1 << 12)
      .help("Number of transformer blocks, or of hidden layers for mlp.");
  model.key("n_head", &ModelSection::n_head)
      .def(12)
      .min(1)
      .only_when("arch", transformers)
      .limit(1 << 12)
      .help("Attention heads per block; must divide n_embd.");
  model.key("kv_heads", &ModelSection::kv_heads)
      .auto_default("n_head (multi-head attention)")
      .min(1)
      .only_when("arch", {"llama"})
      .limit(1 << 12)
      .help(
          "Key/value heads per block (Hugging Face's num_key_value_heads): grouped-query attention, "
          "each shared by n_head / kv_heads query heads; must divide n_head.");
  model.key("n_embd", &ModelSection::n_embd)
      .def(768)
      .min(1)
      .only_when("arch", transformers)
      .limit(1 << 20)
      .help("Model width (embedding and residual stream size).");
  model.key("ffn_dim", &ModelSection::ffn_dim)
      .auto_default("4 x n_embd for gpt; for llama 2/3 x 4 x n_embd rounded up to a multiple of 64")
      .min(1)
      .only_when("arch", transformers)
      .limit(1 << 22)
      .help("Hidden width of each block's feed-forward network.");
  model.key("dropout", &ModelSection::dropout)
      .def(0.0)
      .min(0)
      .below(1)
      .only_when("arch", {"gpt"})
      .help(
          "Dropout probability on the embedding output and on each residual branch (attention and MLP "
          "projections), as GPT-2; the attention probabilities themselves are not dropped.");
  model.key("bias", &ModelSection::bias)
      .def(true)
      .only_when("arch", {"gpt"})
      .help("Use biases in linear layers and LayerNorm.");
  model.key("norm_eps", &ModelSection::norm_eps)
      .def(1e-5)
      .above(0)
      .only_when("arch", transformers)
      .help("Epsilon of LayerNorm/RMSNorm.");
  model.key("qkv_bias", &ModelSection::qkv_bias)
      .def(false)
      .only_when("arch", {"llama"})
      .help(
          "Biases on the query, key and value projections (Qwen2 and Qwen2.5 have them; a model directory's "
          "model_type says). The output projection and the MLP stay without.");
  model.key("rope_theta", &ModelSection::rope_theta)
      .def(10000.0)
      .above(0)
      .only_when("arch", {"llama"})
      .help("Base of the rotary embedding frequencies.");
  model.key("rope_scaling", &ModelSection::rope_scaling)
      .choices(
          {{"none", RopeScalingType::none}, {"linear", RopeScalingType::linear}, {"llama3", RopeScalingType::llama3}})
      .def(RopeScalingType::none)
      .only_when("arch", {"llama"})
      .help(
          "Rescaling of the rotary frequencies for a context longer than the model was trained at, as Hugging "
          "Face's rope_scaling (rope_type) and a model directory's config.json give it: none; linear (position "
          "interpolation: every frequency divided by rope_factor); llama3 (Llama 3.1 and 3.2: wavelengths under "
          "rope_original_context_length / rope_high_freq_factor kept, those over rope_original_context_length / "
          "rope_low_freq_factor divided by rope_factor, those between interpolated). With model.init_from a model "
          "directory, the rope_* keys the recipe gives (with this one) must agree with its config.json.");
  // A recipe that restates a model directory's rope_* values names its rope_scaling type too.
  const std::vector<std::string> scaled{"linear", "llama3"};
  model.key("rope_factor", &ModelSection::rope_factor)
      .def(8.0)
      .min(1)
      .only_when("rope_scaling", scaled)
      .help("How many times longer the context is than the one the model was trained at (Llama 3.1: 8, 3.2: 32).");
  model.key("rope_low_freq_factor", &ModelSection::rope_low_freq_factor)
      .def(1.0)
      .above(0)
      .only_when("rope_scaling", {"llama3"})
      .help("llama3: wavelengths over rope_original_context_length / this are divided by rope_factor.");
  model.key("rope_high_freq_factor", &ModelSection::rope_high_freq_factor)
      .def(4.0)
      .above(0)
      .only_when("rope_scaling", {"llama3"})
      .help("llama3: wavelengths under rope_original_context_length / this are kept; above rope_low_freq_factor.");
  model.key("rope_original_context_length", &ModelSection::rope_original_context_length)
      .def(8192)
      .min(1)
      .only_when("rope_scaling", {"llama3"})
      .unit("tokens")
      .limit(1 << 24)
      .help("llama3: the context length the model was trained at (original_max_position_embeddings).");
  model.key("tie_embeddings", &ModelSection::tie_embeddings)
      .def(true)
      .only_when("arch", transformers)
      .help("Share the token embedding with the output (LM head) weights.");
  model.key("input_dim", &ModelSection::input_dim)
      .def(64)
      .min(1)
      .only_when("arch", {"mlp"})
      .unit("features")
      .limit(1 << 24)
      .help("Number of input features.");
  model.key("hidden_dim", &ModelSection::hidden_dim)
      .def(256)
      .min(1)
      .only_when("arch", {"mlp"})
      .limit(1 << 22)
      .help("Width of each hidden layer.");
  model.key("num_classes", &ModelSection::num_classes)
      .def(10)
      .min(2)
      .only_when("arch", {"mlp"})
      .limit(1 << 24)
      .help("Number of output classes.");
  model.key("activation", &ModelSection::activation)
      .choices({{"relu", Activation::relu}, {"gelu", Activation::gelu}, {"silu", Activation::silu}})
      .def(Activation::relu)
      .only_when("arch", {"mlp"})
      .help("Activation between hidden layers.");
  model.key("init_std", &ModelSection::init_std)
      .def(0.02)
      .above(0)
      .help(
          "Standard deviation of the normal weight initialisation (residual projections are further "
          "scaled by 1/sqrt(2 x n_layer), as GPT-2 does).");
  model.key("init_from", &ModelSection::init_from)
      .must_exist()
      .or_directory()
      .derived_default("none: random initialisation")
      .help(
          "Initial weights: a safetensors file with Hugging Face tensor names and layouts (GPT-2's Conv1D "
          "weights (in, out); Llama's separate q_proj, k_proj and v_proj), or a Hugging Face model directory "
          "(model.safetensors, or the shards of model.safetensors.index.json), relative to the recipe; f32, "
          "bf16 or f16. Every parameter must be present with its shape; an untied lm_head needs "
          "tie_embeddings: false.");
}

}  // namespace engine::recipe
