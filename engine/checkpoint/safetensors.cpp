#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

const std::map<std::string, DType>& dtype_names() {
  static const std::map<std::string, DType> names = {{"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
                                                     {"I32", DType::i32}, {"I64", DType::i64}, {"U16", DType::u16}};
  return names;
}

std::string safetensors_name(DType t) {
  for (const auto& [name, dtype] : dtype_names())
    if (dtype == t) return name;
  return "?";
}

}  // namespace

SafetensorsFile read_safetensors(const fs::path& path) {
  auto fail = [&](const std::string& what) -> UserError { return UserError(path.string() + ": " + what); };
  std::error_code error;
  if (!fs::is_regular_file(path, error)) throw fail("no such file");
  const auto size = uint64_t(fs::file_size(path, error));
  std::ifstream in(path, std::ios::binary);
  if (!in || size < 8) throw fail("not a safetensors file (shorter than its 8-byte header length)");
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), 8);
  if (header_length > size - 8 || header_length > (100u << 20))
    throw fail("header length " + std::to_string(header_length) + " exceeds the file (" + std::to_string(size) +
               " bytes)");
  std::string header(header_length, '\0');
  in.read(header.data(), std::streamsize(header_length));
  nlohmann::json json = nlohmann::json::parse(header, nullptr, false);
  if (json.is_discarded() || !json.is_object()) throw fail("header is not a JSON object");

  const uint64_t data_size = size - 8 - header_length;
  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& item : json.items()) {
    const std::string name = item.key();
    auto& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (auto& [k, v] : entry.items())
        if (v.is_string()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    auto where = [&](const std::string& what) { return fail("tensor '" + name + "': " + what); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw where("needs dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) throw where("dtype is not a string");
    auto dtype = dtype_names().find(entry["dtype"].get<std::string>());
    if (dtype == dtype_names().end()) throw where("unsupported dtype " + entry["dtype"].dump());
    SafeTensor tensor{name, dtype->second, {}, {}};
    if (!entry["shape"].is_array()) throw where("shape is not a list");
    uint64_t elements = 1;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40)) throw where("bad dimension " + d.dump());
      tensor.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(elements, d.get<uint64_t>(), &elements) || elements > (uint64_t(1) << 40))
        throw where("shape too large");
    }
    auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw where("data_offsets must be two non-negative integers");
    uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw where("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] out of bounds of " +
                  std::to_string(data_size) + " data bytes");
    if (end - begin != elements * dtype_size(tensor.dtype))
      throw where("shape needs " + std::to_string(elements * dtype_size(tensor.dtype)) +
                  " bytes but data_offsets cover " + std::to_string(end - begin));
    ranges.emplace_back(begin, end);
    tensor.data.resize(end - begin);
    in.seekg(std::streamoff(8 + header_length + begin));
    in.read(reinterpret_cast<char*>(tensor.data.data()), std::streamsize(end - begin));
    if (!in) throw where("read failed");
    file.tensors.emplace(name, std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) throw fail("tensor data ranges overlap");
  return file;
}

void write_safetensors(const fs::path& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {
        {"dtype", safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data to 8 bytes, as the reference writer does
  write_file_atomically(path, [&](std::ostream& out) {
    uint64_t length = text.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const auto& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size()));
  });
}

}  // namespace engine
