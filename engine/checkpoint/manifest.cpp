#include "checkpoint/manifest.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;
using Json = nlohmann::json;

int64_t CheckpointTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const CheckpointTensor* Manifest::find(const std::string& name, const std::string& kind) const {
  for (const CheckpointTensor& t : tensors)
    if (t.name == name && t.kind == kind) return &t;
  return nullptr;
}

int64_t Manifest::total_bytes() const {
  int64_t n = 0;
  for (const CheckpointFile& f : files) n += f.bytes;
  return n;
}

Json manifest_to_json(const Manifest& m) {
  Json files = Json::array(), tensors = Json::array();
  for (const CheckpointFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", f.xxh3}});
  for (const CheckpointTensor& t : m.tensors) {
    Json pieces = Json::array();
    for (const CheckpointPiece& p : t.pieces)
      pieces.push_back(p.width ? Json{p.file, p.offset, p.first, p.count, p.width}
                               : Json{p.file, p.offset, p.first, p.count});
    tensors.push_back({{"name", t.name}, {"kind", t.kind}, {"shape", t.shape}, {"dtype", "F32"}, {"pieces", pieces}});
  }
  return Json{{"format", "engine checkpoint"},
              {"version", kCheckpointFormatVersion},
              {"step", m.step},
              {"world_size", m.world_size},
              {"tensor_parallel", m.tensor_parallel},
              {"pipeline_parallel", m.pipeline_parallel},
              {"zero_stage", m.zero_stage},
              {"engine_version", m.engine_version},
              {"created", m.created},
              {"state", m.state},
              {"files", files},
              {"pieces",
               "[file, byte offset, first element, elements] or, for a tensor-parallel slice's rows, [file, byte "
               "offset, first element, elements, columns per row]"},
              {"tensors", tensors},
              {"recipe", m.recipe}};
}

Manifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  std::ifstream in(path);
  if (!in)
    throw UserError(dir.string() + " is not a complete checkpoint: it has no " + kManifestName +
                    " (a checkpoint whose write did not finish is never used)");
  Manifest m;
  try {
    const Json j = Json::parse(in);
    if (j.value("format", "") != "engine checkpoint") throw UserError("not an engine checkpoint manifest");
    if (j.at("version").get<int>() != kCheckpointFormatVersion)
      throw UserError("format version " + std::to_string(j.at("version").get<int>()) + ", this engine reads version " +
                      std::to_string(kCheckpointFormatVersion));
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.tensor_parallel = j.value("tensor_parallel", 1);
    m.pipeline_parallel = j.value("pipeline_parallel", 1);
    m.zero_stage = j.at("zero_stage").get<int>();
    m.engine_version = j.value("engine_version", "");
    m.created = j.value("created", "");
    m.state = j.at("state");
    m.recipe = j.at("recipe").get<std::string>();
    for (const Json& f : j.at("files"))
      m.files.push_back(
          {f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(), f.at("xxh3").get<std::string>()});
    for (const Json& t : j.at("tensors")) {
      CheckpointTensor tensor{t.at("name").get<std::string>(),
                              t.at("kind").get<std::string>(),
                              t.at("shape").get<std::vector<int64_t>>(),
                              {}};
      // Pieces are checked to lie inside their files and the tensor, and to hold its elements once
      // (each element counted: flat pieces must not overlap, boxes lie in whole rows of the tensor).
      const int64_t columns = tensor.shape.empty() ? 1 : tensor.numel() / std::max<int64_t>(1, tensor.shape[0]);
      int64_t covered = 0;
      std::vector<std::pair<int64_t, int64_t>> flat;
      for (const Json& p : t.at("pieces")) {
        CheckpointPiece piece{p.at(0).get<int>(), p.at(1).get<int64_t>(), p.at(2).get<int64_t>(),
                              p.at(3).get<int64_t>(), p.size() > 4 ? p.at(4).get<int64_t>() : 0};
        const bool box_fits = piece.width == 0 || (piece.width > 0 && piece.count % piece.width == 0 &&
                                                   piece.first % columns + piece.width <= columns);
        if (piece.file < 0 || size_t(piece.file) >= m.files.size() || piece.offset < 0 || piece.count < 0 ||
            piece.first < 0 || !box_fits || piece.offset + piece.count * 4 > m.files[size_t(piece.file)].bytes ||
            (piece.width ? piece.first + (piece.count / piece.width - 1) * columns + piece.width
                         : piece.first + piece.count) > tensor.numel())
          throw UserError("tensor " + tensor.name + " (" + tensor.kind + ") has a piece outside its files");
        if (!piece.width) flat.emplace_back(piece.first, piece.first + piece.count);
        covered += piece.count;
        tensor.pieces.push_back(piece);
      }
      std::sort(flat.begin(), flat.end());
      for (size_t k = 1; k < flat.size(); ++k)
        if (flat[k].first < flat[k - 1].second)
          throw UserError("tensor " + tensor.name + " (" + tensor.kind + ") has overlapping pieces");
      if (covered != tensor.numel())
        throw UserError("tensor " + tensor.name + " (" + tensor.kind + ") has pieces for " + std::to_string(covered) +
                        " of its " + std::to_string(tensor.numel()) + " elements");
      m.tensors.push_back(std::move(tensor));
    }
  } catch (const Json::exception& e) {
    throw UserError(path.string() + ": malformed checkpoint manifest: " + e.what());
  } catch (const UserError& e) {
    throw UserError(path.string() + ": " + e.what());
  }
  return m;
}

}  // namespace engine
