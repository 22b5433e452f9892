#include "checkpoint/weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/convert.h"
#include "core/error.h"

namespace engine {

namespace {

// One tensor of a file and the rows of an engine parameter it holds, (rows, cols) in the
// parameter's layout; `transposed` files store it (cols, rows).
struct FilePart {
  std::string name;
  int64_t first_row = 0, rows = 0, cols = 0;
  bool transposed = false;
  // The tensor's shape in the file; a part of a parameter that is not a matrix keeps its shape.
  std::vector<int64_t> file_shape(const Shape& parameter) const {
    if (transposed) return {cols, rows};
    if (parameter.rank() == 2) return {rows, cols};
    return parameter.rank() == 1 ? std::vector<int64_t>{rows} : parameter.dims;
  }
};

// The width of q in a fused qkv projection: its weight's columns (n_embd), which its bias alone does
// not say.
int64_t fused_q_width(const Graph& graph, const std::string& weight_name) {
  for (const Graph::WeightRef ref : graph.weights()) {
    const Param& p = graph.weight(ref);
    if (p.name == weight_name) return (p.slice.split() ? p.slice.logical : graph.value(p.value).shape)[1];
  }
  throw InternalError(weight_name + " is missing beside its bias");
}

// The file tensors of one parameter of `graph` (whose shape, whole, is `shape`).
std::vector<FilePart> file_parts(const std::string& name, const Shape& shape, recipe::Arch arch, const Graph& graph) {
  if (arch == recipe::Arch::gpt) {
    for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
      if (name.ends_with(suffix)) return {{.name = name, .rows = shape[0], .cols = shape[1], .transposed = true}};
  }
  const std::string fused = "self_attn.qkv_proj.weight";
  if (arch == recipe::Arch::llama && name.ends_with(fused)) {
    // Rows [q (n_embd) | k | v]; q's width is the input width, k and v share the rest.
    const std::string prefix = name.substr(0, name.size() - fused.size()) + "self_attn.";
    const int64_t c = shape[1], kv = (shape[0] - c) / 2;
    return {{.name = prefix + "q_proj.weight", .first_row = 0, .rows = c, .cols = c},
            {.name = prefix + "k_proj.weight", .first_row = c, .rows = kv, .cols = c},
            {.name = prefix + "v_proj.weight", .first_row = c + kv, .rows = kv, .cols = c}};
  }
  const std::string fused_bias = "self_attn.qkv_proj.bias";
  if (arch == recipe::Arch::llama && name.ends_with(fused_bias)) {
    const std::string prefix = name.substr(0, name.size() - fused_bias.size()) + "self_attn.";
    const int64_t c = fused_q_width(graph, prefix + "qkv_proj.weight"), kv = (shape[0] - c) / 2;
    return {{.name = prefix + "q_proj.bias", .first_row = 0, .rows = c, .cols = 1},
            {.name = prefix + "k_proj.bias", .first_row = c, .rows = kv, .cols = 1},
            {.name = prefix + "v_proj.bias", .first_row = c + kv, .rows = kv, .cols = 1}};
  }
  const int64_t rows = shape.rank() == 0 ? 1 : shape[0];
  return {{.name = name, .rows = rows, .cols = rows == 0 ? 0 : shape.numel() / rows}};
}

// The first NaN or infinite element of `data` as "NaN at element 5 (3 non-finite of 768)", or "".
// Bit patterns rather than std::isfinite: the data is raw bytes from the file, read as f32.
std::string first_non_finite(const std::vector<std::byte>& data) {
  const auto n = int64_t(data.size() / 4);
  int64_t count = 0, first = -1;
  uint32_t first_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data.data() + i * 4, 4);
    if ((bits & 0x7f800000u) != 0x7f800000u) continue;  // exponent all ones: inf or NaN
    if (count++ == 0) first = i, first_bits = bits;
  }
  if (count == 0) return "";
  const char* what = (first_bits & 0x007fffffu) ? "NaN" : (first_bits >> 31) ? "-inf" : "inf";
  return std::string(what) + " at element " + std::to_string(first) + " (" + std::to_string(count) + " non-finite of " +
         std::to_string(n) + ")";
}

// Copies a (rows, cols) block, transposing it when asked.
void copy_block(const float* in, float* out, int64_t rows, int64_t cols, bool transpose) {
  if (!transpose) {
    std::memcpy(out, in, size_t(rows * cols) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// `header`, then the first 20 of `items` one per line, and how many more there are.
std::string listing(std::string header, const std::vector<std::string>& items) {
  for (size_t i = 0; i < items.size() && i < 20; ++i) header += "\n  " + items[i];
  if (items.size() > 20) header += "\n  ... and " + std::to_string(items.size() - 20) + " more";
  return header;
}

// Hugging Face checkpoints carry some tensors that are not parameters: GPT-2's causal-mask buffers
// (h.N.attn.bias, h.N.attn.masked_bias), older Llama files' rotary frequencies
// (model.layers.N.self_attn.rotary_emb.inv_freq) and, for tied models, a copy of the embedding as
// lm_head.weight. A parameter of the same name is never mistaken for one.
bool is_known_buffer(const std::string& name, const std::map<std::string, int>& expected) {
  if (expected.count(name)) return false;
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with(".rotary_emb.inv_freq") || name == "lm_head.weight";
}

// A file that is not safetensors, named for what it is (its first bytes), so that the user is not
// told about a header length: PyTorch's zip or pickle checkpoints, a JSON file, a directory.
void refuse_other_formats(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {};
  in.read(head, 4);
  const std::string what = path.string() + ": not a safetensors file but ";
  if (in.gcount() >= 2 && head[0] == 'P' && head[1] == 'K')
    throw UserError(what +
                    "a zip archive (PyTorch's torch.save format, as in pytorch_model.bin): convert it to "
                    "safetensors (safetensors.torch.save_file) or point at the model's directory");
  if (in.gcount() >= 1 && static_cast<unsigned char>(head[0]) == 0x80)
    throw UserError(what + "a Python pickle (a PyTorch .bin or .pt checkpoint): convert it to safetensors");
  if (in.gcount() >= 1 && head[0] == '{')
    throw UserError(what +
                    "a JSON file: point at the model's directory (its config.json and safetensors) or at a "
                    ".safetensors file");
}

// Every tensor of a weights source: a safetensors file, or a Hugging Face model directory holding
// model.safetensors or the shards its model.safetensors.index.json lists (each tensor in the shard
// the index names, and nowhere else).
SafetensorsFile read_weights_source(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {
    refuse_other_formats(path);
    return read_safetensors(path);
  }
  const fs::path index = path / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    if (fs::exists(path / "model.safetensors")) return read_safetensors(path / "model.safetensors");
    throw UserError(path.string() + ": a directory without model.safetensors or model.safetensors.index.json" +
                    (fs::exists(path / "pytorch_model.bin") ? " (it has pytorch_model.bin: convert it to safetensors)"
                                                            : std::string()));
  }
  nlohmann::json map;
  try {
    std::ifstream in(index);
    map = nlohmann::json::parse(in).at("weight_map");
  } catch (const std::exception& e) {
    throw UserError(index.string() + ": not a safetensors index (a JSON object with a weight_map): " + e.what());
  }
  std::map<std::string, std::set<std::string>> by_file;  // shard -> the tensors the index puts there
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it.value().is_string())
      throw UserError(index.string() + ": weight_map['" + it.key() + "'] is not a file name");
    by_file[it.value().get<std::string>()].insert(it.key());
  }
  SafetensorsFile merged;
  for (const auto& [file, names] : by_file) {
    const fs::path shard = path / file;
    if (!fs::exists(shard))
      throw UserError(index.string() + " names " + file + " (for '" + *names.begin() + "'), which is not in " +
                      path.string());
    SafetensorsFile part = read_safetensors(shard);
    for (auto& [name, tensor] : part.tensors) {
      if (!names.count(name))
        throw UserError(shard.string() + ": holds '" + name + "', which " + index.filename().string() +
                        " does not place in this shard");
      merged.tensors.emplace(name, std::move(tensor));
    }
    for (const std::string& name : names)
      if (!merged.tensors.count(name))
        throw UserError(index.string() + " places '" + name + "' in " + file + ", which does not hold it");
  }
  return merged;
}

// bf16 and f16 tensors widened to f32 (published checkpoints are 16-bit; the masters are f32).
void widen_to_f32(SafeTensor& t) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16) return;
  const auto n = int64_t(t.data.size() / 2);
  std::vector<std::byte> wide(size_t(n) * 4);
  widen(t.data.data(), t.dtype, reinterpret_cast<float*>(wide.data()), n);
  t.data = std::move(wide);
  t.dtype = DType::f32;
}

}  // namespace

std::vector<SafeTensor> hugging_face_tensors(const Graph& graph, recipe::Arch arch,
                                             const std::function<const float*(Graph::WeightRef)>& data) {
  std::vector<SafeTensor> tensors;
  for (const Graph::WeightRef ref : graph.weights()) {
    const Param& p = graph.weight(ref);
    // A tensor-parallel slice's values come whole (`data` assembles them).
    const Shape& shape = p.slice.split() ? p.slice.logical : graph.value(p.value).shape;
    const float* values = data(ref);
    if (!values) continue;  // a weight without the value asked for (a frozen weight's gradient)
    for (const FilePart& part : file_parts(p.name, shape, arch, graph)) {
      SafeTensor t{.name = part.name,
                   .dtype = DType::f32,
                   .shape = part.file_shape(shape),
                   .data = std::vector<std::byte>(size_t(part.rows * part.cols) * sizeof(float))};
      copy_block(values + part.first_row * part.cols, reinterpret_cast<float*>(t.data.data()), part.rows, part.cols,
                 part.transposed);
      tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

std::function<const float*(Graph::WeightRef)> store_weights(const ParameterStore& store) {
  auto scratch = std::make_shared<std::vector<float>>();
  return [&store, scratch](Graph::WeightRef ref) -> const float* {
    if (!ref.frozen) return store.param(ref.index);
    *scratch = store.frozen_values(ref.index);
    return scratch->data();
  };
}

void save_weights(const std::filesystem::path& path, const ParameterStore& store, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata) {
  save_weights(path, store.graph(), arch, metadata, store_weights(store));
}

void save_weights(const std::filesystem::path& path, const Graph& graph, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata,
                  const std::function<const float*(Graph::WeightRef)>& param) {
  std::map<std::string, std::string> with_format = metadata;
  with_format.emplace("format", "pt");  // what transformers' from_pretrained requires of a file
  write_safetensors(path, hugging_face_tensors(graph, arch, param), with_format);
}

bool load_weights(const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch, const Graph* whole) {
  return load_weight_set(read_weights_source(path), path, store, arch, WeightSet::model, whole);
}

bool load_weight_set(SafetensorsFile file, const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch,
                     WeightSet set, const Graph* whole) {
  std::map<std::string, SafeTensor> renamed;
  for (auto& [name, tensor] : file.tensors) {
    std::string plain = name;
    for (const char* prefix : {"base_model.model.", "transformer."})  // PEFT's and GPT-2's
      if (plain.rfind(prefix, 0) == 0) plain = plain.substr(std::string(prefix).size());
    widen_to_f32(tensor);
    renamed.emplace(plain, std::move(tensor));
  }
  const Graph& g = store.graph();
  // The adapters come with the model only when the file has them (a run's own weights); a Hugging
  // Face model directory is the base alone, and the adapters keep their initial values.
  bool with_adapters = set == WeightSet::adapters;
  for (const Param& p : g.params())
    if (is_adapter(p.name) && renamed.count(p.name)) with_adapters = true;
  std::map<std::string, int> expected;  // file tensor name -> weight
  std::vector<std::string> problems, non_finite;
  std::vector<Graph::WeightRef> loaded;
  std::vector<std::vector<float>> values;  // whole weights, set once all are read
  for (const Graph::WeightRef ref : g.weights()) {
    const Param& p = g.weight(ref);
    const bool adapter = is_adapter(p.name);
    if (adapter ? !with_adapters : set == WeightSet::adapters) continue;
    // A tensor-parallel slice is read whole and cut to this rank's part below.
    const Shape& shape = p.slice.split() ? p.slice.logical : g.value(p.value).shape;
    loaded.push_back(ref);
    std::vector<float>& data = values.emplace_back(size_t(shape.numel()));
    for (const FilePart& part : file_parts(p.name, shape, arch, g)) {
      expected[part.name] = int(loaded.size() - 1);
      const std::vector<int64_t> want = part.file_shape(shape);
      auto it = renamed.find(part.name);
      if (it == renamed.end()) {
        problems.push_back("missing tensor '" + part.name + "' " + Shape(want).str());
        continue;
      }
      const SafeTensor& t = it->second;
      if (t.dtype != DType::f32 || t.shape != want) {
        problems.push_back("tensor '" + part.name + "' is " + std::string(dtype_name(t.dtype)) + " " +
                           Shape(t.shape).str() + ", expected f32 " + Shape(want).str() +
                           (adapter ? " (is lora.rank the adapter's r?)" : ""));
        continue;
      }
      // A run from NaN or infinite weights diverges at its first step, far from the cause.
      if (std::string where = first_non_finite(t.data); !where.empty()) {
        non_finite.push_back("tensor '" + (t.name.empty() ? part.name : t.name) + "': " + where);
        continue;
      }
      const float* in = reinterpret_cast<const float*>(t.data.data());
      float* out = data.data() + part.first_row * part.cols;
      if (part.transposed)
        copy_block(in, out, part.cols, part.rows, true);  // the file's (cols, rows) back to (rows, cols)
      else
        copy_block(in, out, part.rows, part.cols, false);
    }
  }
  // The tensors of the weights other pipeline stages hold: theirs to load.
  std::set<std::string> here, elsewhere;
  for (const Graph::WeightRef ref : g.weights()) here.insert(g.weight(ref).name);
  if (whole)
    for (const Graph::WeightRef ref : whole->weights()) {
      const Param& p = whole->weight(ref);
      if (here.count(p.name) || (set == WeightSet::adapters && !is_adapter(p.name))) continue;
      for (const FilePart& part : file_parts(p.name, whole->value(p.value).shape, arch, *whole))
        elsewhere.insert(part.name);
    }
  auto anywhere = [&](const std::string& name) { return expected.count(name) || elsewhere.count(name); };
  // An adapter's file holds adapters only: anything else in it (a module PEFT saved whole, as its
  // modules_to_save) would be dropped, so it is named.
  for (const auto& [name, t] : renamed)
    if (!anywhere(name) && (set == WeightSet::adapters || !is_known_buffer(name, expected)))
      problems.push_back("unexpected tensor '" + name + "'" +
                         (is_adapter(name) && g.frozen().empty() ? " (a LoRA adapter: set lora.rank to load it)" : ""));
  // A tied model takes a file's lm_head.weight only when it is the embedding itself: a head of its
  // own would be dropped, and a different model trained.
  const std::string embedding = arch == recipe::Arch::llama ? "model.embed_tokens.weight" : "wte.weight";
  const auto head = renamed.find("lm_head.weight"), embed = renamed.find(embedding);
  if (set == WeightSet::model && !anywhere("lm_head.weight") && head != renamed.end() && embed != renamed.end() &&
      head->second.data != embed->second.data)
    problems.push_back("lm_head.weight differs from " + embedding +
                       ": the checkpoint's head is untied; set model.tie_embeddings: false to load it");
  if (expected.count("lm_head.weight") && head == renamed.end() && embed != renamed.end())
    problems.push_back("no lm_head.weight: the checkpoint's head is tied to " + embedding +
                       "; set model.tie_embeddings: true to load it");
  if (!problems.empty()) {
    std::string message = listing(path.string() + ": weights do not fit the model:", problems);
    if (arch == recipe::Arch::llama && renamed.count("model.layers.0.self_attn.qkv_proj.weight"))
      message +=
          "\n  note: this file has fused self_attn.qkv_proj weights; weight files use Hugging Face's separate "
          "q_proj, k_proj and v_proj";
    throw UserError(message);
  }
  if (!non_finite.empty()) {
    throw UserError(listing(path.string() + ": initial weights must be finite:", non_finite));
  }
  for (size_t i = 0; i < loaded.size(); ++i) {
    const TensorSlice& slice = g.weight(loaded[i]).slice;
    if (slice.split()) {
      std::vector<float> part(static_cast<size_t>(slice.numel()));
      slice.take(values[i].data(), part.data());
      values[i] = std::move(part);
    }
    store.set_weight(loaded[i], values[i].data());
  }
  return with_adapters;
}

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

namespace {

// The model_type of the Hugging Face directory a run started from ("" where it started elsewhere).
std::string source_model_type(const std::filesystem::path& init_from) {
  const std::filesystem::path file = init_from / "config.json";
  if (init_from.empty() || !std::filesystem::is_regular_file(file)) return "";
  try {
    std::ifstream in(file);
    return nlohmann::json::parse(in).value("model_type", "");
  } catch (const nlohmann::json::exception&) {
    return "";  // the run read it at start; a file changed since then describes nothing of this model
  }
}

}  // namespace

std::string hugging_face_config(const recipe::ModelSection& m, DType dtype) {
  const char* torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  nlohmann::json j;
  if (m.arch == recipe::Arch::gpt) {
    if (!m.bias)
      throw UserError(
          "model.bias false: GPT-2's Hugging Face class has biases in every linear layer and LayerNorm, "
          "so no config.json can describe this model");
    const int64_t ffn = m.ffn_dim.value_or(4 * m.n_embd);
    j = {{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"vocab_size", m.vocab_size},
         {"n_positions", m.context_length},
         {"n_embd", m.n_embd},
         {"n_layer", m.n_layer},
         {"n_head", m.n_head},
         {"n_inner", ffn == 4 * m.n_embd ? nlohmann::json() : nlohmann::json(ffn)},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", m.norm_eps},
         {"resid_pdrop", m.dropout},
         {"embd_pdrop", m.dropout},
         {"attn_pdrop", 0.0},
         {"tie_word_embeddings", m.tie_embeddings},
         {"torch_dtype", torch_dtype}};
  } else if (m.arch == recipe::Arch::llama) {
    j = {{"model_type", "llama"},
         {"architectures", {"LlamaForCausalLM"}},
         {"vocab_size", m.vocab_size},
         {"hidden_size", m.n_embd},
         {"intermediate_size", m.ffn_dim.value_or(0)},
         {"num_hidden_layers", m.n_layer},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", m.kv_heads.value_or(m.n_head)},
         {"max_position_embeddings", m.context_length},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", m.tie_embeddings},
         {"torch_dtype", torch_dtype}};
    if (m.qkv_bias) {  // Llama with q, k and v biases is Qwen2
      j["model_type"] = "qwen2";
      j["architectures"] = {"Qwen2ForCausalLM"};
      j["use_sliding_window"] = false;
      j.erase("attention_bias");
      j.erase("mlp_bias");
    } else if (source_model_type(m.init_from) == "mistral") {  // Mistral without a sliding window, as it came
      j["model_type"] = "mistral";
      j["architectures"] = {"MistralForCausalLM"};
      j["sliding_window"] = nullptr;
      j.erase("attention_bias");
      j.erase("mlp_bias");
    }
    if (m.rope_scaling == recipe::RopeScalingType::linear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", m.rope_factor}};
    } else if (m.rope_scaling == recipe::RopeScalingType::llama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", m.rope_factor},
                           {"low_freq_factor", m.rope_low_freq_factor},
                           {"high_freq_factor", m.rope_high_freq_factor},
                           {"original_max_position_embeddings", m.rope_original_context_length}};
    }
  } else {
    throw UserError("model.arch mlp has no Hugging Face class: no config.json can describe it");
  }
  return j.dump(2) + "\n";
}

}  // namespace engine
