#include "checkpoint/adapters.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/weights.h"
#include "core/error.h"
#include "recipe/lora_targets.h"

namespace engine {

namespace {

// PEFT names a module by its path in the transformers model: GPT-2's blocks sit under transformer.
std::string peft_prefix(recipe::Arch arch) {
  return arch == recipe::Arch::gpt ? "base_model.model.transformer." : "base_model.model.";
}

const float* floats(const SafeTensor& t) { return reinterpret_cast<const float*>(t.data.data()); }

}  // namespace

std::map<std::string, std::string> lora_metadata(const recipe::Recipe& r) {
  std::string problem, targets;
  for (const std::string& name : recipe::lora_target_names(r.lora.target_modules)) {
    if (name == "all-linear") {
      targets.clear();
      for (const std::string& m : recipe::lora_targets(r.model.arch, "all-linear", &problem))
        targets += (targets.empty() ? "" : ",") + m.substr(m.find('.') + 1);
      break;
    }
    targets += (targets.empty() ? "" : ",") + name;
  }
  return {{"lora_rank", std::to_string(r.lora.rank)},
          {"lora_alpha", nlohmann::json(r.lora.alpha).dump()},
          {"lora_dropout", nlohmann::json(r.lora.dropout).dump()},
          {"lora_target_modules", targets}};
}

LoraSettings lora_settings(const std::map<std::string, std::string>& metadata) {
  LoraSettings lora;
  auto rank = metadata.find("lora_rank");
  if (rank == metadata.end()) return lora;
  lora.rank = std::stoll(rank->second);
  lora.alpha = std::stod(metadata.at("lora_alpha"));
  lora.dropout = std::stod(metadata.at("lora_dropout"));
  lora.target_modules = recipe::lora_target_names(metadata.at("lora_target_modules"));
  lora.arch = metadata.count("arch") && metadata.at("arch") == "llama" ? recipe::Arch::llama : recipe::Arch::gpt;
  return lora;
}

void load_adapters(const std::filesystem::path& path, ParameterStore& store, const recipe::Recipe& recipe,
                   const Graph* whole) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(path) ? path / "adapter_model.safetensors" : path;
  if (!fs::exists(file))
    throw UserError(path.string() + ": a directory without adapter_model.safetensors (a PEFT adapter's weights)");
  const fs::path config = file.parent_path() / "adapter_config.json";
  if (fs::exists(config)) {
    nlohmann::json j;
    try {
      std::ifstream in(config);
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw UserError(config.string() + ": not JSON: " + e.what());
    }
    if (j.value("peft_type", std::string("LORA")) != "LORA")
      throw UserError(config.string() + ": a " + j.value("peft_type", std::string()) + " adapter, not LORA");
    if (j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() != recipe.lora.rank)
      throw UserError(config.string() + ": r is " + j["r"].dump() + " but lora.rank is " +
                      std::to_string(recipe.lora.rank));
    if (j.contains("lora_alpha") && j["lora_alpha"].is_number() && j["lora_alpha"].get<double>() != recipe.lora.alpha)
      throw UserError(config.string() + ": lora_alpha is " + j["lora_alpha"].dump() + " but lora.alpha is " +
                      nlohmann::json(recipe.lora.alpha).dump());
    if (j.value("use_dora", false) || j.value("use_rslora", false))
      throw UserError(config.string() + ": DoRA and rsLoRA adapters are not supported");
    // Per-module ranks and scales, and modules trained whole, are PEFT features the engine's
    // adapters do not have: refused rather than dropped.
    for (const char* key : {"rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"})
      if (j.contains(key) && !j[key].is_null() && !j[key].empty())
        throw UserError(config.string() + ": " + key + " " + j[key].dump() + " is not supported (one rank and alpha " +
                        "for every adapter, no modules trained whole)");
  }
  load_weight_set(read_safetensors(file), file, store, recipe.model.arch, WeightSet::adapters, whole);
}

void merge_adapters(std::vector<SafeTensor>& tensors, const LoraSettings& lora) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index[tensors[i].name] = i;
  const double scale = lora.alpha / double(lora.rank);
  for (const SafeTensor& a : tensors) {
    if (!a.name.ends_with(".lora_A.weight")) continue;
    const std::string module = a.name.substr(0, a.name.size() - std::string(".lora_A.weight").size());
    auto b_at = index.find(module + ".lora_B.weight"), w_at = index.find(module + ".weight");
    if (b_at == index.end() || w_at == index.end())
      throw UserError("adapter " + module + " has no lora_B or no base weight " + module + ".weight to merge into");
    const SafeTensor& b = tensors[b_at->second];
    SafeTensor& w = tensors[w_at->second];
    const int64_t r = a.shape[0], in = a.shape[1], out = b.shape[0];
    // GPT-2's Conv1D weights are stored (in, out); every other linear weight (out, in).
    const bool conv1d = lora.arch == recipe::Arch::gpt;
    const std::vector<int64_t> expected = conv1d ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in};
    if (w.shape != expected) throw UserError("adapter " + module + " does not fit its weight " + module + ".weight");
    float* wd = reinterpret_cast<float*>(w.data.data());
    const float *ad = floats(a), *bd = floats(b);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0;
        for (int64_t k = 0; k < r; ++k) sum += double(bd[o * r + k]) * double(ad[k * in + i]);
        float& target = conv1d ? wd[i * out + o] : wd[o * in + i];
        target = float(double(target) + scale * sum);
      }
  }
  std::erase_if(tensors, [](const SafeTensor& t) { return is_adapter(t.name); });
}

std::vector<SafeTensor> peft_adapter_tensors(const std::vector<SafeTensor>& tensors, const LoraSettings& lora) {
  std::vector<SafeTensor> adapters;
  for (const SafeTensor& t : tensors)
    if (is_adapter(t.name)) {
      adapters.push_back(t);
      adapters.back().name = peft_prefix(lora.arch) + t.name;
    }
  return adapters;
}

std::string peft_adapter_config(const LoraSettings& lora) {
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", lora.rank},
                      {"lora_alpha", lora.alpha},
                      {"lora_dropout", lora.dropout},
                      {"target_modules", lora.target_modules},
                      {"bias", "none"},
                      {"fan_in_fan_out", lora.arch == recipe::Arch::gpt},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"modules_to_save", nullptr},
                      {"base_model_name_or_path", nullptr},
                      {"use_rslora", false},
                      {"use_dora", false}};
  return j.dump(2) + "\n";
}

}  // namespace engine
