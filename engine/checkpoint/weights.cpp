#include "checkpoint/weights.h"

#include <cstring>
#include <map>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace engine {

namespace {

bool is_conv1d(const std::string& name, recipe::Arch arch) {
  if (arch != recipe::Arch::gpt) return false;
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    std::string s = suffix;
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
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

void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

}  // namespace

void save_weights(const std::filesystem::path& path, const ParameterStore& store, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata) {
  const Graph& g = store.graph();
  std::vector<SafeTensor> tensors;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const Param& p = g.params()[i];
    const Shape& shape = g.value(p.value).shape;
    SafeTensor t{p.name, DType::f32, shape.dims, std::vector<std::byte>(size_t(shape.numel()) * 4)};
    const float* data = store.param(int(i));
    if (is_conv1d(p.name, arch)) {
      transpose(data, reinterpret_cast<float*>(t.data.data()), shape[0], shape[1]);
      t.shape = {shape[1], shape[0]};
    } else {
      std::memcpy(t.data.data(), data, t.data.size());
    }
    tensors.push_back(std::move(t));
  }
  write_safetensors(path, tensors, metadata);
}

// Hugging Face checkpoints carry some tensors that are not parameters: GPT-2's causal-mask buffers
// (h.N.attn.bias, h.N.attn.masked_bias) and, for tied models, a copy of the embedding as
// lm_head.weight. GPT2LMHeadModel also prefixes every name with "transformer.".
bool is_known_buffer(const std::string& name, const Graph& graph) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) {
    for (const Param& p : graph.params())
      if (p.name == name) return false;
    return true;
  }
  if (name == "lm_head.weight") {
    for (const Param& p : graph.params())
      if (p.name == name) return false;
    return true;  // tied: the embedding is the head
  }
  return false;
}

void load_weights(const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch) {
  SafetensorsFile file = read_safetensors(path);
  std::map<std::string, SafeTensor> renamed;
  for (auto& [name, tensor] : file.tensors) {
    std::string plain = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    renamed.emplace(plain, std::move(tensor));
  }
  file.tensors = std::move(renamed);
  const Graph& g = store.graph();
  std::vector<std::string> problems, non_finite;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const Param& p = g.params()[i];
    const Shape& shape = g.value(p.value).shape;
    auto it = file.tensors.find(p.name);
    if (it == file.tensors.end()) {
      problems.push_back("missing tensor '" + p.name + "' " + shape.str());
      continue;
    }
    const SafeTensor& t = it->second;
    bool conv = is_conv1d(p.name, arch);
    std::vector<int64_t> expected = conv ? std::vector<int64_t>{shape[1], shape[0]} : shape.dims;
    if (t.dtype != DType::f32 || t.shape != expected) {
      problems.push_back("tensor '" + p.name + "' is " + std::string(dtype_name(t.dtype)) + " " + Shape(t.shape).str() +
                         ", expected f32 " + Shape(expected).str());
      continue;
    }
    // A run from NaN or infinite weights diverges at its first step, far from the cause.
    if (std::string where = first_non_finite(t.data); !where.empty()) {
      non_finite.push_back("tensor '" + (t.name.empty() ? it->first : t.name) + "': " + where);
      continue;
    }
    float* data = store.param(int(i));
    if (conv)
      transpose(reinterpret_cast<const float*>(t.data.data()), data, shape[1], shape[0]);
    else
      std::memcpy(data, t.data.data(), t.data.size());
  }
  for (const auto& [name, t] : file.tensors) {
    bool known = false;
    for (const Param& p : g.params()) known = known || p.name == name;
    if (!known && !is_known_buffer(name, g)) problems.push_back("unexpected tensor '" + name + "'");
  }
  if (!problems.empty()) {
    std::string message = path.string() + ": weights do not fit the model:";
    for (size_t i = 0; i < problems.size() && i < 20; ++i) message += "\n  " + problems[i];
    if (problems.size() > 20) message += "\n  ... and " + std::to_string(problems.size() - 20) + " more";
    throw UserError(message);
  }
  if (!non_finite.empty()) {
    std::string message = path.string() + ": initial weights must be finite:";
    for (size_t i = 0; i < non_finite.size() && i < 20; ++i) message += "\n  " + non_finite[i];
    if (non_finite.size() > 20) message += "\n  ... and " + std::to_string(non_finite.size() - 20) + " more";
    throw UserError(message);
  }
  store.refresh_copies();
}

}  // namespace engine
