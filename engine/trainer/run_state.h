// The run's state in a checkpoint: what a manifest records besides the rank files (counters, data
// position, loss scaler, plugins, RNG streams, the recipe), and putting a session back into it.
//
//   Manifest m = checkpoint_manifest(steps, session, plugins, recipe_yaml, summary, elapsed, kinds);
//   restore_checkpoint(session, plugins, dir, read_manifest(dir));   // any world size and stage
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/sharded_state.h"
#include "trainer/plugin_driver.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine {

// Everything but the rank files: the state that determines the rest of the run after `steps` steps.
Manifest checkpoint_manifest(int64_t steps, Session& session, PluginDriver& plugins, const std::string& recipe_yaml,
                             const TrainSummary& summary, double elapsed, const std::vector<StateKind>& kinds);

// Puts a session and its plugins in the state of checkpoint `m` (read from `dir`), at this run's
// world size and ZeRO stage.
void restore_checkpoint(Session& session, PluginDriver& plugins, const std::filesystem::path& dir, const Manifest& m);

// metrics.jsonl as it was at the checkpoint's step: lines of later steps, from the run that was cut
// off, would repeat once the resumed run logs them again.
void truncate_metrics(const std::filesystem::path& path, int64_t step);

}  // namespace engine
