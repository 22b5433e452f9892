// Telemetry of real training runs: the trace (format, flat events that account for each step,
// FLOPs that add up to the plan's, a lane per thread, one process per rank), MFU against a hand
// calculation, and every logged number read back from the TensorBoard files by TensorBoard.
#include <gtest/gtest.h>

#include <chrono>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "linalg/gemm16.h"
#include "read_events.h"
#include "recipe/load.h"
#include "scoped_env.h"
#include "temp_dir.h"
#include "trainer/train.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;
const fs::path kSource = ENGINE_SOURCE_DIR;

fs::path train_quickstart(const TempDir& dir, std::vector<std::string> overrides, std::string* printed = nullptr) {
  overrides.push_back("run.output_dir=" + dir.path().string());
  overrides.push_back("run.name=run");
  recipe::LoadOptions options;
  options.overrides = overrides;
  std::ostringstream console;
  train(recipe::load_recipe(kSource / "recipes/quickstart.yaml", options), console);
  if (printed) *printed = console.str();
  return dir / "run";
}

json read_json(const fs::path& file) {
  std::ifstream in(file);
  return json::parse(in);
}

std::vector<json> metrics_lines(const fs::path& run) {
  std::vector<json> lines;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

// Checks the trace-event format (the JSON Object Format of Chrome's trace-event specification, as
// Perfetto reads it) and returns the complete ("X") events.
std::vector<json> checked_events(const json& trace) {
  EXPECT_TRUE(trace.is_object());
  EXPECT_TRUE(trace.at("traceEvents").is_array());
  std::vector<json> complete;
  std::map<std::string, int> open_async;
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    EXPECT_TRUE(e.at("name").is_string());
    EXPECT_TRUE(e.at("pid").is_number_integer());
    if (ph == "M") {
      EXPECT_TRUE(e.at("args").at(e.at("name") == "process_sort_index" ? "sort_index" : "name").is_primitive());
      continue;
    }
    EXPECT_TRUE(e.at("tid").is_number_integer());
    EXPECT_TRUE(e.at("ts").is_number());
    EXPECT_TRUE(e.at("cat").is_string());
    if (ph == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      complete.push_back(e);
    } else if (ph == "b" || ph == "e") {
      open_async[e.at("id").get<std::string>()] += ph == "b" ? 1 : -1;
    } else {
      ADD_FAILURE() << "unexpected phase " << ph;
    }
  }
  for (const auto& [id, open] : open_async) EXPECT_EQ(open, 0) << "async event " << id << " not closed";
  return complete;
}

bool inside(const json& e, const json& step) {
  const double begin = step.at("ts"), end = begin + step.at("dur").get<double>();
  return e.at("pid") == step.at("pid") && e.at("ts").get<double>() >= begin &&
         e.at("ts").get<double>() + e.at("dur").get<double>() <= end + 1e-3;
}

TEST(Trace, EventsFollowTheFormatAndAccountForEveryTracedStep) {
  TempDir dir("trace");
  const fs::path run =
      train_quickstart(dir, {"train.steps=6", "telemetry.trace_start=3", "telemetry.trace_steps=2",
                             "checkpoint.every_steps=3", "train.eval_every=4", "telemetry.peak_flops=1e11"});
  const std::vector<json> events = checked_events(read_json(run / "trace.json"));
  const json summary = read_json(run / "summary.json");
  std::vector<json> steps;
  for (const json& e : events)
    if (e.at("cat") == "step") steps.push_back(e);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].at("name"), "step 3");
  EXPECT_EQ(steps[1].at("name"), "step 4");
  std::set<std::string> categories;
  for (const json& step : steps) {
    std::vector<json> children;
    for (const json& e : events)
      if (&e != &step && e.at("tid") == 0 && e.at("cat") != "step" && inside(e, step)) children.push_back(e);
    std::sort(children.begin(), children.end(), [](const json& a, const json& b) { return a.at("ts") < b.at("ts"); });
    double covered = 0, flops = 0, largest_gap = 0, end = step.at("ts");
    std::string before_gap;
    for (size_t i = 0; i < children.size(); ++i) {
      const json& e = children[i];
      covered += e.at("dur").get<double>();
      if (e.at("ts").get<double>() - end > largest_gap) {
        largest_gap = e.at("ts").get<double>() - end;
        before_gap = e.at("name");
      }
      end = std::max(end, e.at("ts").get<double>() + e.at("dur").get<double>());
      categories.insert(e.at("cat"));
      if (i + 1 < children.size()) {  // flat: no event on the step's lane holds another
        EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), children[i + 1].at("ts").get<double>() + 1e-3)
            << e.dump() << " overlaps " << children[i + 1].dump();
      }
      if (e.at("cat") == "op") {
        EXPECT_GT(e.at("args").at("bytes").get<double>(), 0) << e.dump();
        flops += e.at("args").at("flops").get<double>();
      }
    }
    const double duration = step.at("dur");
    if (step.at("ts").get<double>() + duration - end > largest_gap) {
      largest_gap = step.at("ts").get<double>() + duration - end;
      before_gap = "the step's end";
    }
    EXPECT_GE(covered, 0.95 * duration) << step.at("name") << ": events cover " << covered << " of " << duration
                                        << " us; the largest gap, " << largest_gap << " us, is before " << before_gap;
    EXPECT_LE(covered, duration * 1.0001);
    if (step.at("name") == "step 3") {  // step 4 also evaluates, whose ops are one event
      EXPECT_DOUBLE_EQ(flops, summary.at("hardware_flops_per_step").get<double>());
    }
    EXPECT_DOUBLE_EQ(step.at("args").at("flops").get<double>(), summary.at("hardware_flops_per_step").get<double>());
  }
  for (const char* category : {"op", "data", "optimizer", "communication", "checkpoint", "other"})
    EXPECT_TRUE(categories.count(category)) << "no " << category << " event in the traced steps";
  bool evaluation = false, written = false;
  for (const json& e : events) {
    evaluation = evaluation || e.at("name") == "evaluation";
    if (e.at("name") == "checkpoint write") {  // async: on the writer's lane, with its size
      written = true;
      EXPECT_EQ(e.at("tid"), 1);
      EXPECT_GT(e.at("args").at("bytes").get<double>(), 0);
    }
  }
  EXPECT_TRUE(evaluation);
  EXPECT_TRUE(written);
}

TEST(Trace, OffloadTransfersAreAsyncEventsOnTheSwapLane) {
  TempDir dir("trace_offload");
  TempDir swap("trace_swap");
  const fs::path run = train_quickstart(
      dir, {"train.steps=3", "telemetry.trace_start=2", "telemetry.trace_steps=1", "offload.optimizer=nvme",
            "offload.nvme_path=" + swap.path().string(), "offload.chunk_size=16384", "telemetry.peak_flops=1e11"});
  const json trace = read_json(run / "trace.json");
  checked_events(trace);
  double read = 0, written = 0;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "b") {
      EXPECT_EQ(e.at("cat"), "offload");
      EXPECT_EQ(e.at("tid"), 2);
      (e.at("name") == "swap read" ? read : written) += e.at("args").at("bytes").get<double>();
    }
  // One step streams the offloaded state in and out (fp32 AdamW: the moments), the same bytes each way.
  EXPECT_GT(read, 0);
  EXPECT_EQ(read, written);
}

TEST(Trace, EveryRankIsAProcessTrackInOneFile) {
  TempDir dir("trace_mpi");
  const std::string command = std::string(MPIEXEC) + " --allow-run-as-root --oversubscribe -n 2 " + ENGINE_BINARY +
                              " train " + (kSource / "recipes/quickstart.yaml").string() +
                              " train.steps=3 distributed.zero_stage=3 telemetry.trace_start=2 telemetry.trace_steps=1 "
                              "telemetry.peak_flops=1e11 run.name=run run.output_dir=" +
                              dir.path().string() + " > " + (dir / "log").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << std::ifstream(dir / "log").rdbuf();
  const std::vector<json> events = checked_events(read_json(dir / "run/trace.json"));
  std::map<int, int> steps, gathers;
  for (const json& e : events) {
    if (e.at("cat") == "step") ++steps[e.at("pid").get<int>()];
    if (e.at("name") == "wait all-gather") ++gathers[e.at("pid").get<int>()];
  }
  EXPECT_EQ(steps, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(gathers.size(), 2u);  // stage 3's gathers on both ranks' tracks
  // A rank's step carries that rank's FLOPs: the sum of its own ops.
  for (const json& step : events) {
    if (step.at("cat") != "step") continue;
    double flops = 0;
    for (const json& e : events)
      if (e.at("cat") == "op" && e.at("tid") == 0 && inside(e, step)) flops += e.at("args").at("flops").get<double>();
    EXPECT_DOUBLE_EQ(step.at("args").at("flops").get<double>(), flops) << "rank " << step.at("pid");
  }
}

// Model FLOPs of the quick-start GPT by hand: per token and layer the four linear layers hold
// 12 C^2 weights (qkv 3C^2, projection C^2, MLP 8C^2), 2 FLOPs per weight; the head 2 C V; per
// sequence and layer attention's two products over the causal half (T(T+1)/2 entries) 2 x 2 C
// each; forward + backward = 3 x forward.
double quickstart_model_flops_per_step() {
  const double B = 16, T = 64, C = 64, L = 2, V = 64;
  const double linears = B * T * (L * 2 * 12 * C * C + 2 * C * V);
  const double attention = B * L * 2 * 2 * C * (T * (T + 1) / 2);
  return 3 * (linears + attention);
}

TEST(Mfu, MatchesAHandCalculationForTheQuickStartModel) {
  EXPECT_EQ(quickstart_model_flops_per_step(), 680263680.0);
  for (const char* policy : {"none", "full"}) {
    TempDir dir("mfu");
    const auto began = std::chrono::steady_clock::now();
    const fs::path run = train_quickstart(dir, {"train.steps=12", "train.log_every=4", "telemetry.peak_flops=2e11",
                                                std::string("activation_checkpointing.policy=") + policy});
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    int logged = 0;
    double logged_step_time = 0;
    for (const json& line : metrics_lines(run)) {
      if (!line.contains("mfu")) continue;
      ++logged;
      const double model = line.at("model_flops_per_step"), step_time = line.at("step_time_s");
      logged_step_time += step_time;
      EXPECT_EQ(model, quickstart_model_flops_per_step()) << policy;  // recompute is not model FLOPs
      // MFU from the hand-counted FLOPs and the given peak, over a step time the test bounds below.
      EXPECT_NEAR(line.at("mfu").get<double>(), quickstart_model_flops_per_step() / step_time / 2e11, 1e-12);
      EXPECT_NEAR(step_time, 16 * 64 / line.at("tokens_per_second").get<double>(), 1e-9 * step_time);
      EXPECT_GT(line.at("hfu").get<double>(), line.at("mfu").get<double>());
    }
    EXPECT_EQ(logged, 4) << policy;  // steps 1, 4, 8, 12
    // The step times are the run's own clock; four of its steps fit inside the test's clock of it all.
    EXPECT_GT(logged_step_time, 0.0);
    EXPECT_LT(logged_step_time, wall) << policy;
    const json summary = read_json(run / "summary.json");
    EXPECT_EQ(summary.at("peak_flops_per_rank").get<double>(), 2e11);
    const double recompute = summary.at("recompute_flops_per_step");
    EXPECT_EQ(recompute > 0, std::string(policy) == "full");
  }
}

// A 16-bit run on a CPU without a 16-bit matmul says, once, that its linears compute in fp32;
// fp32 runs, and 16-bit runs where the matmul exists, say nothing of it.
TEST(Mfu, SixteenBitWithoutA16BitMatmulSaysItSavesMemoryNotTime) {
  for (const char* mode : {"fp32", "bf16"}) {
    TempDir dir("note");
    std::string printed;
    train_quickstart(dir, {"train.steps=1", "telemetry.peak_flops=1e11", std::string("precision.mode=") + mode},
                     &printed);
    const bool expected = std::string(mode) == "bf16" && !ops::matmul_16bit_available(DType::bf16);
    EXPECT_EQ(printed.find("saves memory here, not time") != std::string::npos, expected) << mode << ":\n" << printed;
  }
}

// The probed peak is cached; a run says when it was probed on a busy machine (at its start and in
// the op table's heading), and a run whose step beats it drops it from the cache, so that the next
// run probes again. A peak the recipe gives is the user's: it is never dropped.
TEST(Mfu, APeakProbedOnABusyMachineIsNamedAndOneTheStepBeatsIsDropped) {
  TempDir cache("peak_cache");
  const testing::ScopedEnv cache_home("XDG_CACHE_HOME", cache.path().string());
  const fs::path file = cache / "engine/peak_flops.json";
  const std::string busy_note = "the peak was probed while other processes kept 60% of the cores busy";
  TempDir first("probe");
  std::string printed;
  train_quickstart(first, {"train.steps=1"}, &printed);
  EXPECT_NE(printed.find("GFLOP/s per rank (measured"), std::string::npos) << printed;
  json entries = read_json(file);
  ASSERT_EQ(entries.size(), 1u);  // the fp32 peak
  json& peak = entries.begin().value();
  const double probed = peak.at("per_second").get<double>();
  auto rewrite = [&](double per_second, double busy) {
    peak = {{"per_second", per_second}, {"neighbours_busy_percent", busy}};
    std::ofstream(file) << entries.dump();
  };
  rewrite(probed, 5);  // under the threshold: nothing to say
  TempDir quiet("quiet");
  train_quickstart(quiet, {"train.steps=1"}, &printed);
  EXPECT_EQ(printed.find("probed while other processes kept"), std::string::npos) << printed;
  rewrite(probed, 60);
  TempDir busy("busy");
  train_quickstart(busy, {"train.steps=1", "telemetry.op_table=true"}, &printed);
  EXPECT_NE(printed.find("note: " + busy_note), std::string::npos) << printed;
  EXPECT_NE(printed.find("op table (telemetry.op_table; roofline against"), std::string::npos) << printed;
  EXPECT_NE(printed.find("; " + busy_note + ", so it may read low"), std::string::npos) << printed;
  ASSERT_TRUE(read_json(file).contains(entries.begin().key()));  // kept: it may read only a little low

  TempDir recipe("recipe");
  train_quickstart(recipe, {"train.steps=2", "train.log_every=1", "telemetry.peak_flops=1e3"}, &printed);
  EXPECT_NE(printed.find("exceeds telemetry.peak_flops (0.0 GFLOP/s per rank): the figure is too low"),
            std::string::npos)
      << printed;
  EXPECT_TRUE(read_json(file).contains(entries.begin().key()));  // the cache is not the recipe's to change

  rewrite(1e3, 0);  // far below any step
  TempDir low("low");
  train_quickstart(low, {"train.steps=2", "train.log_every=1"}, &printed);
  EXPECT_NE(printed.find("exceeds the peak (cached in " + file.string() + "), so its probe read low"),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("dropped from the cache, the next run probes again"), std::string::npos) << printed;
  EXPECT_FALSE(read_json(file).contains(entries.begin().key()));
  TempDir again("again");
  train_quickstart(again, {"train.steps=1"}, &printed);
  EXPECT_NE(printed.find("GFLOP/s per rank (measured"), std::string::npos) << printed;
}

TEST(TensorBoard, EveryLoggedNumberReadsBackExactlyWithTheRecipeAndNormHistograms) {
  TempDir dir("tensorboard_run");
  const fs::path run = train_quickstart(dir, {"train.steps=12", "train.log_every=4", "train.eval_every=6",
                                              "telemetry.peak_flops=1e11", "telemetry.monitor_interval=0.01"});
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(run / "tensorboard")) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  const json read = testing::read_with_tensorboard(files[0]);
  ASSERT_FALSE(read.is_null());
  EXPECT_EQ(read.at("record_error"), nullptr);
  const json& scalars = read.at("scalars");
  auto value_at = [&](const std::string& tag, int64_t step) -> std::optional<double> {
    if (!scalars.contains(tag)) return std::nullopt;
    for (const json& point : scalars.at(tag))
      if (point.at("step") == step) return point.at("value").get<double>();
    return std::nullopt;
  };
  std::map<std::string, int> checked;
  for (const json& line : metrics_lines(run)) {
    const int64_t step = line.at("step");
    for (const auto& [key, value] : line.items()) {
      if (key == "step" || !value.is_number()) continue;
      std::string tag;
      for (const std::string group : {"train/", "eval/", "throughput/", "memory/", "hardware/"})
        if (scalars.contains(group + key)) tag = group + key;
      ASSERT_FALSE(tag.empty()) << key << " is not in TensorBoard";
      const std::optional<double> got = value_at(tag, step);
      ASSERT_TRUE(got) << tag << " at step " << step;
      EXPECT_EQ(*got, double(float(value.get<double>()))) << tag << " at step " << step;
      ++checked[key];
    }
  }
  for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_second", "mfu", "hfu", "step_time_s", "val_loss",
                          "rss_bytes", "cpu_util"})
    EXPECT_GT(checked[key], 0) << key;
  EXPECT_TRUE(scalars.contains("hardware/core0_util"));
  const json& text = read.at("texts").at("recipe");
  EXPECT_NE(text[0].at("text")[0].get<std::string>().find("synthetic_markov"), std::string::npos);
  for (const char* tag : {"norms/gradient_per_unit", "norms/parameter_per_unit"}) {
    const json& histograms = read.at("histograms").at(tag);
    EXPECT_EQ(histograms.size(), 4u) << tag;       // steps 1, 4, 8, 12
    EXPECT_EQ(histograms[0].at("num"), 4) << tag;  // one norm per wrap unit
    EXPECT_GT(histograms[0].at("max").get<double>(), 0) << tag;
  }
}

TEST(OpTable, IsARecipeOptionWithEveryOpOfTheStep) {
  TempDir dir("op_table");
  const fs::path run = train_quickstart(dir, {"train.steps=3", "telemetry.op_table=true", "telemetry.peak_flops=1e11"});
  const json table = read_json(run / "op_table.json");
  std::set<std::string> ops;
  for (const json& row : table) {
    ops.insert(row.at("op"));
    EXPECT_GT(row.at("calls").get<int64_t>(), 0);
    EXPECT_GE(row.at("seconds").get<double>(), 0);
    if (row.at("op") == "gelu") {  // 1 FLOP per 8 bytes: below any machine's balance
      EXPECT_EQ(row.at("bound"), "memory");
      EXPECT_GT(row.at("percent_of_bound").get<double>(), 0);
    }
  }
  for (const char* op : {"linear", "linear_backward_weight", "causal_attention", "causal_attention_backward",
                         "softmax_cross_entropy", "layernorm", "gelu"})
    EXPECT_TRUE(ops.count(op)) << op;
  TempDir off("op_table_off");
  const fs::path quiet = train_quickstart(off, {"train.steps=1", "telemetry.peak_flops=1e11"});
  EXPECT_FALSE(fs::exists(quiet / "op_table.json"));
}

}  // namespace
}  // namespace engine
