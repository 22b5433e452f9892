// safetensors: the weights file format of Hugging Face. An 8-byte little-endian header length, a
// JSON header mapping tensor names to {dtype, shape, data_offsets}, then the raw data.
//
// The reader refuses anything malformed with a UserError naming the file and the problem: a header
// length beyond the file, invalid JSON, unknown dtypes, shapes that disagree with their byte range,
// offsets out of bounds, overlapping or leaving gaps. The writer writes to a temporary file and
// renames it into place, so a crash never leaves a half-written weights file.
//
//   SafetensorsFile file = read_safetensors("model.safetensors");
//   const SafeTensor& t = file.tensors.at("wte.weight");   // t.dtype, t.shape, t.data
//   write_safetensors("out.safetensors", {{"wte.weight", DType::f32, {V, C}, bytes}}, metadata);
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace engine {

struct SafeTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

struct SafetensorsFile {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

SafetensorsFile read_safetensors(const std::filesystem::path& path);
void write_safetensors(const std::filesystem::path& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace engine
