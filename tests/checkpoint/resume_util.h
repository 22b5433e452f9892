// What the resume tests compare: a run's logged trajectory (every metrics.jsonl line but the
// checkpoint events, without its timings), its final weights file and its checkpoint after the last
// step (every rank file: masters, optimizer moments, counters), byte for byte; and the tiny
// quick-start recipe they train, small enough that a straight run, a run cut at step k and its
// resumption take a few hundred milliseconds.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "recipe/load.h"
#include "telemetry/measurements.h"
#include "trainer/train.h"

namespace engine::testing {

inline const std::filesystem::path kSourceDir = ENGINE_SOURCE_DIR;

// The straight run's length and where the cut runs stop.
inline constexpr int64_t kSteps = 8;
inline constexpr int64_t kCut = 3;

// fp16 that overflows in its first steps (the scale backs off from 2^24, after the hysteresis's
// first one), grows after two clean steps and overflows again (in one process: steps 1-5 skipped,
// the scale doubled at 7, step 8 skipped): the scale changes after the cut and steps after it
// overflow, so a resumed run that lost the scaler's state (scale, hysteresis, clean-step count)
// would log other scales and other losses.
inline const std::vector<std::string> kFp16 = {"precision.mode=fp16", "precision.initial_scale_power=24",
                                               "precision.growth_interval=2"};

// Where an fp16 case's cut run stops: after step 6, the first update that applied (steps 1-5
// overflow), so the checkpoint it resumes from holds non-zero moments and an Adam step count; a cut
// at kCut would carry the state of a model that never updated.
inline constexpr int64_t kFp16Cut = 6;

inline std::vector<std::string> precision_overrides(const std::string& precision) {
  if (precision == "fp16") return kFp16;
  return {"precision.mode=" + precision};
}

// One cell of the exact-resume matrix: a ZeRO stage x a precision x an accumulation.
struct Case {
  int stage;
  std::string precision;
  int accumulation;
  bool lora = false;  // LoRA adapters (with dropout) on every linear layer, the base frozen
};

inline void PrintTo(const Case& c, std::ostream* out) {
  *out << "stage " << c.stage << ", " << c.precision << ", accumulation " << c.accumulation << (c.lora ? ", LoRA" : "");
}

// The overrides that make a tiny run a LoRA run: rank 4 on every linear layer, adapter dropout.
inline const std::vector<std::string> kLoraOverrides = {"lora.rank=4", "lora.alpha=8", "lora.dropout=0.1"};

inline std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "stage" + std::to_string(info.param.stage) + "_" + info.param.precision + "_accumulation" +
         std::to_string(info.param.accumulation) + (info.param.lora ? "_lora" : "");
}

// Every stage 0-3 x fp32/bf16/fp16 x accumulation 1/2.
inline std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* precision : {"fp32", "bf16", "fp16"})
      for (int accumulation : {1, 2}) cases.push_back({stage, precision, accumulation});
  return cases;
}

// LoRA runs resume too: the checkpoint holds the adapters, the frozen base comes from the start.
inline std::vector<Case> lora_cases() {
  return {{0, "fp32", 2, true}, {1, "bf16", 1, true}, {2, "fp16", 2, true}, {3, "bf16", 2, true}};
}

// Where a case's cut run stops.
inline int64_t cut_of(const Case& c) { return c.precision == "fp16" ? kFp16Cut : kCut; }

// The recipe overrides of a case: its precision, stage and accumulation, and a checkpoint after the
// last step (compared byte for byte between the straight and the resumed run).
inline std::vector<std::string> case_overrides(const Case& c) {
  std::vector<std::string> overrides = precision_overrides(c.precision);
  overrides.push_back("checkpoint.at_end=true");
  overrides.push_back("distributed.zero_stage=" + std::to_string(c.stage));
  overrides.push_back("train.gradient_accumulation_steps=" + std::to_string(c.accumulation));
  if (c.lora) overrides.insert(overrides.end(), kLoraOverrides.begin(), kLoraOverrides.end());
  return overrides;
}

// The quick start shrunk: one layer of width 32, 16 tokens of context, micro-batches of 4; every
// step logged, an evaluation every 4 steps (so evaluations fall after the cut too).
inline recipe::LoadedRecipe tiny_recipe(const std::filesystem::path& output_dir, std::vector<std::string> overrides,
                                        int64_t world = 1) {
  std::vector<std::string> all = {"run.name=run",
                                  "run.output_dir=" + output_dir.string(),
                                  "model.n_layer=1",
                                  "model.n_embd=32",
                                  "model.context_length=16",
                                  "train.micro_batch_size=4",
                                  "train.steps=" + std::to_string(kSteps),
                                  "train.log_every=1",
                                  "train.eval_every=4",
                                  "train.eval_batches=2",
                                  "scheduler.warmup_steps=2"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  recipe::LoadOptions options;
  options.overrides = std::move(all);
  options.world = {world, "the test"};
  return recipe::load_recipe(kSourceDir / "recipes/quickstart.yaml", options);
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Trajectory {
  std::vector<nlohmann::json> lines;  // metrics.jsonl without checkpoint events and timings
  std::string weights;                // model.safetensors
};

inline Trajectory trajectory(const std::filesystem::path& run_dir) {
  Trajectory t;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("event")) continue;  // where checkpoints went differs between the runs by design
    t.lines.push_back(without_measurements(j));
  }
  t.weights = read_bytes(run_dir / "model.safetensors");
  return t;
}

// The lines of steps after `step` (a run resumed elsewhere logs only those).
inline std::vector<nlohmann::json> after(const std::vector<nlohmann::json>& lines, int64_t step) {
  std::vector<nlohmann::json> kept;
  for (const nlohmann::json& j : lines)
    if (j.at("step").get<int64_t>() > step) kept.push_back(j);
  return kept;
}

// Same lines (losses, learning rates, gradient norms, loss scales, overflows, validation losses,
// in order and as the same doubles) and the same weights file, byte for byte.
inline void expect_same_run(const Trajectory& got, const Trajectory& want, const std::string& what) {
  ASSERT_FALSE(want.weights.empty()) << what << ": the straight run wrote no weights";
  ASSERT_EQ(got.lines.size(), want.lines.size()) << what;
  for (size_t i = 0; i < want.lines.size(); ++i) EXPECT_EQ(got.lines[i], want.lines[i]) << what << ", line " << i;
  EXPECT_TRUE(got.weights == want.weights) << what << ": the final weights differ";
}

// The checkpoints after the last step of two runs hold the same state: every rank file byte for
// byte, and the same manifest but for when it was written, the run's wall time and its output
// directory (in the recipe it embeds).
inline void expect_same_final_checkpoint(const std::filesystem::path& got_run, const std::filesystem::path& want_run,
                                         const std::string& what) {
  const std::string last = "checkpoints/step-" + std::to_string(kSteps);
  const std::filesystem::path got = got_run / last, want = want_run / last;
  ASSERT_TRUE(std::filesystem::exists(want / "manifest.json")) << what << ": no checkpoint after the last step";
  ASSERT_TRUE(std::filesystem::exists(got / "manifest.json")) << what << ": no checkpoint after the last step";
  auto manifest = [](const std::filesystem::path& dir) {
    nlohmann::json j = nlohmann::json::parse(read_bytes(dir / "manifest.json"));
    j.erase("created");
    j.erase("recipe");
    j["state"].erase("elapsed_s");  // the run's wall time
    return j;
  };
  EXPECT_EQ(manifest(got), manifest(want)) << what;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(want)) {
    if (entry.path().extension() != ".bin") continue;
    ++files;
    EXPECT_TRUE(read_bytes(got / entry.path().filename()) == read_bytes(entry.path()))
        << what << ": " << entry.path().filename() << " differs";
  }
  EXPECT_GT(files, 0) << what;
}

// How many per-step lines (loss, lr, gradient norm) the run logged: one a step with log_every 1.
inline size_t step_lines(const std::vector<nlohmann::json>& lines) {
  size_t n = 0;
  for (const nlohmann::json& j : lines) n += j.contains("grad_norm") && !j.contains("overflow");
  return n;
}

// The loss scales the run logged by step, for the fp16 cases' claim that the scale moved.
inline std::vector<std::pair<int64_t, double>> loss_scales(const std::vector<nlohmann::json>& lines) {
  std::vector<std::pair<int64_t, double>> scales;
  for (const nlohmann::json& j : lines)
    if (j.contains("loss_scale") && !j.contains("overflow"))
      scales.emplace_back(j.at("step").get<int64_t>(), j.at("loss_scale").get<double>());
  return scales;
}

inline int64_t overflows(const std::vector<nlohmann::json>& lines) {
  int64_t n = 0;
  for (const nlohmann::json& j : lines) n += j.contains("overflow");
  return n;
}

// The fp16 cases only prove the scaler is restored (scale, hysteresis, clean steps) if the scale
// moves and a step overflows after the cut.
inline void expect_scale_changes_after_cut(const std::vector<nlohmann::json>& lines, int64_t cut = kFp16Cut) {
  const auto scales = loss_scales(lines);
  double at_cut = -1;
  bool changed = false;
  for (const auto& [step, scale] : scales) {
    if (step == cut) at_cut = scale;
    if (step > cut && at_cut > 0 && scale != at_cut) changed = true;
  }
  EXPECT_GT(at_cut, 0) << "no loss scale logged at step " << cut;
  EXPECT_TRUE(changed) << "the loss scale stays " << at_cut << " after step " << cut;
  int64_t overflows_after_cut = 0, updates_before_cut = 0;
  for (const nlohmann::json& j : lines) {
    const int64_t step = j.at("step").get<int64_t>();
    overflows_after_cut += j.contains("overflow") && step > cut;
    updates_before_cut += j.contains("grad_norm") && !j.contains("overflow") && step <= cut;
  }
  EXPECT_GE(overflows_after_cut, 1) << "no step after " << cut << " overflowed";
  EXPECT_GE(updates_before_cut, 1) << "no update applied by step " << cut << ": the cut carries no optimizer state";
}

}  // namespace engine::testing
