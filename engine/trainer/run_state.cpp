#include "trainer/run_state.h"

#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "checkpoint/sharded_state.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/version.h"
#include "models/pipeline_stage.h"

namespace engine {

namespace fs = std::filesystem;

Manifest checkpoint_manifest(int64_t steps, Session& session, PluginDriver& plugins, const std::string& recipe_yaml,
                             const TrainSummary& summary, double elapsed, const std::vector<StateKind>& kinds) {
  const recipe::Recipe& r = session.recipe;
  Manifest m;
  m.step = steps;
  const int stages = session.pipeline.stages;
  m.world_size = session.world * session.tensor_layout.size * stages;  // rank files
  m.tensor_parallel = session.tensor_layout.size;
  m.pipeline_parallel = stages;
  m.zero_stage = int(r.distributed.zero_stage);
  m.engine_version = std::string(kVersion) + " " + kGitRevision;
  m.recipe = recipe_yaml;
  std::vector<std::string> names;
  for (const StateKind& k : kinds) names.push_back(k.name);
  if (stages == 1) {
    m.tensors = describe_tensors(session.model.graph, session.world, names, session.tensor_layout.size);
  } else {
    // Every stage's tensors, from the stages' graphs (each rank computes its own stage alone); a
    // weight two stages hold (a tied embedding) is described once, from the first.
    const std::vector<ModelGraph> parts = cut_stages(build_model(r, 1, 1.0, {session.tensor_layout.size, 0}),
                                                     pipeline_boundaries(r, stages, session.tensor_layout.size));
    std::set<std::pair<std::string, std::string>> described;
    for (int stage = 0; stage < stages; ++stage)
      for (CheckpointTensor& t : describe_tensors(parts[size_t(stage)].graph, session.world, names,
                                                  session.tensor_layout.size, stages, stage))
        if (described.insert({t.name, t.kind}).second) m.tensors.push_back(std::move(t));
  }
  const LossScaler::State scaler = session.scaler.state();
  m.state = {{"step", steps},
             {"updates", session.updates},
             {"skipped_steps", summary.skipped_steps},
             {"micro_batches", steps * session.accumulation * session.world},
             {"micro_batch_size", session.micro_batch},
             {"gradient_accumulation_steps", session.accumulation},
             {"world_size", session.world},
             {"global_batch_size", session.micro_batch * session.accumulation * session.world},
             {"compute_dtype", dtype_name(session.model.graph.param_dtype())},
             {"loss_scaler",
              {{"enabled", scaler.enabled},
               {"scale", scaler.scale},
               {"hysteresis_left", scaler.hysteresis_left},
               {"clean_steps", scaler.clean_steps},
               {"skipped", scaler.skipped}}},
             {"last_loss", summary.final_loss},
             {"elapsed_s", elapsed},
             {"plugins", plugins.save_state()},
             {"rng",
              {{"seed", r.run.seed},
               {"streams",
                "counter-based: initialisation (seed, parameter), data order (seed, micro-batch index), dropout "
                "(seed, step, global micro-batch); nothing else draws"}}}};
  // A LoRA checkpoint holds the adapters; the base they were trained over is named by its digest,
  // so a resume over other base weights is refused rather than trained on.
  if (!session.model.graph.frozen().empty())
    m.state["frozen_weights"] = {{"elements", session.frozen_base_elements}, {"digest", session.frozen_base_digest}};
  return m;
}

void restore_checkpoint(Session& session, PluginDriver& plugins, const std::filesystem::path& dir, const Manifest& m) {
  const nlohmann::json& state = m.state;
  load_sharded_state(dir, m, session.store, state_kinds(session.store, *session.optimizer));
  session.updates = state.at("updates").get<int64_t>();
  session.optimizer->set_steps(session.updates);
  if (state.at("compute_dtype").get<std::string>() != dtype_name(session.model.graph.param_dtype()))
    session.fall_back_to_bf16();  // the run had left fp16 for bf16
  const nlohmann::json& s = state.at("loss_scaler");
  session.scaler.restore({s.at("enabled").get<bool>(), s.at("scale").get<double>(),
                          s.at("hysteresis_left").get<int64_t>(), s.at("clean_steps").get<int64_t>(),
                          s.at("skipped").get<int64_t>()});
  session.zero.finish_update();  // the compute copies from the restored masters
  session.host_changed();        // a GPU run takes its state from the host's anew
  plugins.restore_state(state.at("plugins"));
  if (state.contains("frozen_weights")) {
    // The whole base's digest; a checkpoint from before it names its one rank's buffer (xxh3).
    const nlohmann::json& base = state["frozen_weights"];
    if (base.contains("digest") ? base["digest"].get<std::string>() != session.frozen_base_digest
                                : base.value("xxh3", std::string()) != session.store.frozen_digest())
      throw UserError(dir.string() + ": its adapters were trained over other frozen base weights than this run " +
                      "starts from (model.init_from " +
                      (session.recipe.model.init_from.empty() ? std::string("none: the seed's random weights")
                                                              : session.recipe.model.init_from.string()) +
                      "): resume over the base the run started with");
  }
}

void truncate_metrics(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && j["step"].is_number() && j["step"].get<int64_t>() > step) continue;
    kept += line + "\n";
  }
  in.close();
  write_file_atomically(path, [&](std::ostream& out) { out << kept; });
}

}  // namespace engine
