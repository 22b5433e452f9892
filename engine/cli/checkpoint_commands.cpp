// engine checkpoint list|inspect|verify: what a run's checkpoints hold, and whether they are intact.
//
// A checkpoint is <dir>/step-N with a manifest.json (checkpoint/manifest.h); a .tmp-step-N
// directory is a write that never finished, which nothing trusts. `list` shows both, `inspect` one
// checkpoint's manifest, and `verify` reads every rank file against the size and checksum its
// manifest records, so a damaged checkpoint is found before a resume or an export needs it.
#include <algorithm>
#include <iostream>
#include <map>
#include <optional>

#include "checkpoint/checkpointer.h"
#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"
#include "cli/commands.h"
#include "core/error.h"
#include "trainer/progress_line.h"

namespace engine::cli {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

bool is_checkpoint(const fs::path& path) { return fs::exists(path / kManifestName); }

std::string pad(std::string text, size_t width, bool right = false) {
  if (text.size() >= width) return text;
  return right ? std::string(width - text.size(), ' ') + text : text + std::string(width - text.size(), ' ');
}

template <typename T>
T state_value(const Json& state, const char* key, T fallback) {
  return state.is_object() && state.contains(key) && !state[key].is_null() ? state[key].get<T>() : fallback;
}

// What one verified file came to: empty when it matches its manifest entry.
std::string check_file(const fs::path& dir, const CheckpointFile& file) {
  const fs::path path = dir / file.name;
  int64_t size = 0;
  uint64_t sum = 0;
  try {
    sum = read_file_chunks(path, [&](const std::byte*, size_t bytes, int64_t at) { size = at + int64_t(bytes); });
  } catch (const CheckpointIoError& e) {
    return std::string("unreadable: ") + e.what();
  }
  if (size != file.bytes)
    return "wrong size: " + std::to_string(size) + " bytes, the manifest says " + std::to_string(file.bytes) +
           (size < file.bytes ? " (truncated)" : "");
  if (checksum_hex(sum) != file.xxh3)
    return "corrupted: xxh3 " + checksum_hex(sum) + ", the manifest says " + file.xxh3;
  return "";
}

// Verifies one checkpoint, printing a line per file; returns "<file>: <problem>" for each bad one.
std::vector<std::string> verify_one(const fs::path& dir) {
  std::cout << dir.string() << "\n";
  Manifest m;
  try {
    m = read_manifest(dir);  // also checks that every tensor's pieces lie inside the files
  } catch (const UserError& e) {
    std::cout << "  manifest: " << e.what() << "\n";
    return {e.what()};
  }
  std::vector<std::string> bad;
  for (const CheckpointFile& file : m.files) {
    const std::string problem = check_file(dir, file);
    if (problem.empty()) {
      std::cout << "  " << file.name << "  OK (" << file.bytes << " bytes, xxh3 " << file.xxh3 << ")\n";
    } else {
      std::cout << "  " << file.name << "  " << problem << "\n";
      bad.push_back((dir / file.name).string() + ": " + problem);
    }
  }
  std::cout << "  " << m.tensors.size() << " tensors, every piece inside its file\n";
  return bad;
}

}  // namespace

fs::path checkpoints_in(const fs::path& path) {
  if (!fs::is_directory(path))
    throw UserError(path.string() + ": " + (fs::exists(path) ? "not a directory" : "no such directory"));
  // A run directory keeps its checkpoints in checkpoints/ (the default checkpoint.dir).
  if (!is_checkpoint(path) && committed_checkpoints(path).empty() && fs::is_directory(path / "checkpoints"))
    return path / "checkpoints";
  return path;
}

int checkpoint_list(const fs::path& path) {
  const fs::path dir = checkpoints_in(path);
  if (is_checkpoint(dir)) throw UserError(dir.string() + " is one checkpoint: see `engine checkpoint inspect`");
  std::vector<std::pair<int64_t, std::string>> rows;  // by step; committed before unfinished
  for (const fs::path& checkpoint : committed_checkpoints(dir)) {
    const int64_t step = checkpoint_step_in_name(checkpoint.filename().string(), "step-").value_or(0);
    try {
      const Manifest m = read_manifest(checkpoint);
      rows.emplace_back(step, pad(std::to_string(m.step), 8, true) + pad(std::to_string(m.world_size), 7, true) +
                                  pad(std::to_string(m.zero_stage), 6, true) + "  " +
                                  pad(format_bytes(m.total_bytes()), 10) + "  " + m.created + "  " +
                                  checkpoint.filename().string());
    } catch (const UserError& e) {
      rows.emplace_back(step, pad(std::to_string(step), 8, true) + "  unreadable manifest: " + e.what());
    }
  }
  std::vector<std::pair<int64_t, std::string>> unfinished;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (auto step = checkpoint_step_in_name(entry.path().filename().string(), ".tmp-step-");
        step && entry.is_directory())
      unfinished.emplace_back(*step,
                              entry.path().filename().string() + ": incomplete, ignored (a write that did not finish)");
  std::sort(unfinished.begin(), unfinished.end());
  if (rows.empty())
    std::cout << "no complete checkpoint in " << dir.string() << "\n";
  else
    std::cout << "checkpoints in " << dir.string() << "\n"
              << "    step  world  zero  size        created               directory\n";
  for (const auto& [step, row] : rows) std::cout << row << "\n";
  for (const auto& [step, row] : unfinished) std::cout << "  " << row << "\n";
  return kExitOk;
}

int checkpoint_inspect(const fs::path& dir) {
  const Manifest m = read_manifest(dir);
  const Json& s = m.state;
  std::cout << "checkpoint " << dir.string() << "\n"
            << "  step            " << m.step << "\n"
            << "  world size      " << m.world_size << ", ZeRO stage " << m.zero_stage << "\n"
            << "  engine          " << m.engine_version << "\n"
            << "  created         " << m.created << "\n";

  const int64_t micro = state_value<int64_t>(s, "micro_batch_size", 0);
  const int64_t accumulation = state_value<int64_t>(s, "gradient_accumulation_steps", 0);
  const int64_t world = state_value<int64_t>(s, "world_size", m.world_size);
  std::cout << "training state\n"
            << "  updates         " << state_value<int64_t>(s, "updates", 0) << " ("
            << state_value<int64_t>(s, "skipped_steps", 0) << " steps skipped)\n"
            << "  last loss       " << format_fixed(state_value<double>(s, "last_loss", 0.0), 4) << "\n";
  if (s.contains("loss_scaler")) {
    const Json& scaler = s["loss_scaler"];
    if (state_value<bool>(scaler, "enabled", false))
      std::cout << "  loss scale      " << state_value<double>(scaler, "scale", 1.0) << " (dynamic, "
                << state_value<int64_t>(scaler, "skipped", 0) << " overflows skipped)\n";
    else
      std::cout << "  loss scale      none (" << state_value<std::string>(s, "compute_dtype", "f32") << ")\n";
  }
  std::cout << "  data position   " << state_value<int64_t>(s, "micro_batches", 0) << " micro-batches\n"
            << "  global batch    " << state_value<int64_t>(s, "global_batch_size", micro * accumulation * world)
            << " = " << micro << " micro x " << accumulation << " accumulation x " << world << " ranks\n";

  std::cout << "files (" << m.files.size() << ", " << format_bytes(m.total_bytes()) << ")\n";
  for (const CheckpointFile& f : m.files)
    std::cout << "  " << f.name << "  " << f.bytes << " bytes  xxh3 " << f.xxh3 << "\n";

  std::map<std::string, int64_t> per_kind, elements;
  for (const CheckpointTensor& t : m.tensors) {
    ++per_kind[t.kind];
    elements[t.kind] += t.numel();
  }
  std::cout << "tensors (" << m.tensors.size() << ")\n";
  // "master" first: the weights; then the optimizer's states.
  if (per_kind.count("master"))
    std::cout << "  " << pad("master", 16) << per_kind["master"] << " tensors, " << elements["master"] << " elements\n";
  for (const auto& [kind, count] : per_kind)
    if (kind != "master")
      std::cout << "  " << pad(kind, 16) << count << " tensors, " << elements[kind] << " elements\n";
  return kExitOk;
}

int checkpoint_verify(const fs::path& path) {
  std::vector<fs::path> checkpoints;
  if (is_checkpoint(path)) {
    checkpoints.push_back(path);
  } else {
    const fs::path dir = checkpoints_in(path);
    checkpoints = committed_checkpoints(dir);
    if (checkpoints.empty())
      throw UserError(path.string() + ": neither a checkpoint (no manifest.json) nor a directory holding one");
  }
  std::vector<std::string> bad;
  for (const fs::path& checkpoint : checkpoints)
    for (std::string& problem : verify_one(checkpoint)) bad.push_back(std::move(problem));
  if (!bad.empty()) {
    std::string message = "verify: " + std::to_string(bad.size()) + (bad.size() == 1 ? " file is" : " files are") +
                          " damaged; resume or export from another checkpoint";
    for (const std::string& problem : bad) message += "\n  " + problem;
    throw UserError(message);
  }
  std::cout << (checkpoints.size() == 1 ? "checkpoint OK" : std::to_string(checkpoints.size()) + " checkpoints OK")
            << "\n";
  return kExitOk;
}

}  // namespace engine::cli
