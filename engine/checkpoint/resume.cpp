#include "checkpoint/resume.h"

#include "recipe/schema.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;

std::optional<fs::path> resume_source(const recipe::Recipe& r, const std::string& argument) {
  const fs::path dir = checkpoint_directory(r);
  if (argument.empty() || argument == "latest") {
    const std::vector<fs::path> found = committed_checkpoints(dir);
    if (!found.empty()) return found.back();
    if (argument.empty()) return std::nullopt;  // checkpoint.resume: auto, and nothing to resume yet
    throw UserError("--resume: " + dir.string() + " holds no complete checkpoint (checkpoint.dir; a checkpoint is " +
                    "complete once its manifest.json is written)");
  }
  const fs::path path = argument;
  if (fs::exists(path / kManifestName)) return path;
  const std::vector<fs::path> found = committed_checkpoints(path);
  if (!found.empty()) return found.back();
  throw UserError("--resume " + argument + ": " +
                  (fs::exists(path) ? "neither a complete checkpoint (no manifest.json) nor a directory of them"
                                    : "no such file or directory"));
}

namespace {

void flatten(const YAML::Node& node, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& item : node)
      flatten(item.second, prefix.empty() ? item.first.as<std::string>() : prefix + "." + item.first.as<std::string>(),
              out);
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out[prefix] = text.c_str();
}

bool starts_with(const std::string& key, const std::string& prefix) { return key.rfind(prefix, 0) == 0; }

enum class Change { silent, noted, refused };

Change classify(const std::string& key) {
  for (const char* k : {"checkpoint.", "train.log_every", "train.eval_every", "train.eval_batches", "run.name",
                        "run.output_dir", "data.prefetch", "run.cuda_graphs"})
    if (starts_with(key, k)) return Change::silent;
  // Handled by keep_global_batch: the global batch is what must stay.
  for (const char* k : {"train.gradient_accumulation_steps", "train.global_batch_size"})
    if (key == k) return Change::silent;
  for (const char* k :
       {"train.steps", "train.gradient_clipping", "scheduler.", "optimizer.lr", "optimizer.weight_decay",
        "distributed.", "offload.", "activation_checkpointing.", "plugins", "precision.growth_interval",
        "precision.scale_factor", "precision.hysteresis", "precision.min_scale", "precision.on_min_scale", "run.device",
        "run.fusions", "run.deterministic"})  // a checkpoint is the host's record: it resumes on either device
    if (starts_with(key, k)) return Change::noted;
  return Change::refused;
}

std::string why_refused(const std::string& key) {
  if (starts_with(key, "model.")) return "the checkpoint holds another model";
  if (starts_with(key, "data.")) return "the data or its order would change under the saved data position";
  if (key == "run.seed") return "the seed draws dropout and the data order";
  if (key == "train.micro_batch_size") return "the data position counts micro-batches of the saved size";
  if (starts_with(key, "optimizer.")) return "the saved optimizer state means something else under it";
  if (starts_with(key, "precision.")) return "the run's numerics would change";
  return "it changes what the checkpoint's state means";
}

}  // namespace

std::vector<std::string> check_recipe_change(const std::string& saved_yaml, const std::string& current_yaml) {
  std::map<std::string, std::string> saved, current;
  flatten(YAML::Load(saved_yaml), "", saved);
  flatten(YAML::Load(current_yaml), "", current);
  std::vector<std::string> notes, refused;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? std::string("(absent)") : it->second;
  };
  std::map<std::string, bool> keys;
  for (const auto& [k, v] : saved) keys[k] = true;
  for (const auto& [k, v] : current) keys[k] = true;
  for (const auto& [key, unused] : keys) {
    const std::string before = value(saved, key), after = value(current, key);
    if (before == after) continue;
    // A key the engine gained after the checkpoint was written, at its default, changes nothing.
    if (!saved.count(key))
      if (const recipe::KeySpec* spec = recipe::Schema::engine().find_key(key);
          spec && spec->default_value && recipe::format_value(*spec->default_value) == after)
        continue;
    const std::string change = key + ": " + before + " -> " + after;
    switch (classify(key)) {
      case Change::silent:
        break;
      case Change::noted:
        notes.push_back("resume: " + change + " (applies from the next step)");
        break;
      case Change::refused:
        refused.push_back(change + " (" + why_refused(key) + ")");
    }
  }
  if (!refused.empty()) {
    std::string message = "cannot resume: the recipe differs from the checkpoint's in ways a resumed run cannot take:";
    for (const std::string& r : refused) message += "\n  " + r;
    message +=
        "\nresume with the checkpoint's values (its recipe is in manifest.json: engine checkpoint inspect), or "
        "start a new run (model.init_from takes weights exported with engine export)";
    throw UserError(message);
  }
  return notes;
}

void keep_global_batch(recipe::Recipe& r, const nlohmann::json& state, int world, std::vector<std::string>& notes) {
  const int64_t global = state.at("global_batch_size").get<int64_t>();
  const int64_t micro = *r.train.micro_batch_size;
  const int64_t saved_world = state.at("world_size").get<int64_t>();
  const int64_t saved_accumulation = state.at("gradient_accumulation_steps").get<int64_t>();
  if (micro * *r.train.gradient_accumulation_steps * world == global) return;
  const int64_t per_accumulation = micro * world;
  if (global % per_accumulation != 0)
    throw UserError("cannot resume at world size " + std::to_string(world) + ": the checkpoint's global batch " +
                    std::to_string(global) + " (micro_batch_size " + std::to_string(micro) + " x accumulation " +
                    std::to_string(saved_accumulation) + " x world size " + std::to_string(saved_world) +
                    ") is not a multiple of micro_batch_size " + std::to_string(micro) + " x world size " +
                    std::to_string(world) + " = " + std::to_string(per_accumulation) +
                    "; resume with a world size that divides " + std::to_string(global / micro));
  const int64_t accumulation = global / per_accumulation;
  notes.push_back("elastic: world size " + std::to_string(saved_world) + " -> " + std::to_string(world) +
                  ", gradient_accumulation_steps " + std::to_string(*r.train.gradient_accumulation_steps) + " -> " +
                  std::to_string(accumulation) + " keeps the global batch of " + std::to_string(global) +
                  " (micro_batch_size " + std::to_string(micro) + " x " + std::to_string(accumulation) + " x " +
                  std::to_string(world) + ")");
  r.train.gradient_accumulation_steps = accumulation;
  r.train.global_batch_size = global;
}

}  // namespace engine
