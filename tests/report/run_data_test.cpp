// Reading a run directory: every series, the events, summary and recipe, the trace's breakdown,
// and errors that name the file and line.
#include "report/run_data.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../temp_dir.h"
#include "core/error.h"
#include "run_fixture.h"

namespace engine::report {
namespace {

using engine::testing::TempDir;

TEST(ReadRun, ReadsEverySeriesEventAndFile) {
  TempDir dir("report_read");
  engine::testing::write_run(dir.path());
  const RunData run = read_run(dir.path());
  ASSERT_NE(run.find("loss"), nullptr);
  EXPECT_EQ(run.find("loss")->steps.size(), 81u);  // the overflow line is not a point of the loss
  EXPECT_EQ(run.find("loss")->steps.front(), 1);
  EXPECT_EQ(run.find("loss")->steps.back(), 400);
  for (const char* key : {"lr", "grad_norm", "tokens_per_second", "elapsed_s", "step_time_s", "mfu", "hfu", "rss_bytes",
                          "mem_available_bytes", "cpu_util", "process_cpu_util", "temperature_c", "loss_scale"})
    EXPECT_NE(run.find(key), nullptr) << key;
  EXPECT_EQ(run.val_loss.steps, (std::vector<double>{50, 100, 150, 200, 250, 300, 350, 400}));
  EXPECT_EQ(run.checkpoint_steps, (std::vector<double>{100, 200, 300, 400}));
  EXPECT_EQ(run.overflow_steps, (std::vector<double>{201}));
  EXPECT_EQ(run.find("event"), nullptr);
  EXPECT_EQ(run.summary_number("loss_floor"), 2.2);
  EXPECT_FALSE(run.summary_number("absent"));
  EXPECT_NE(run.recipe_text.find("n_layer: 4"), std::string::npos);
  ASSERT_TRUE(run.breakdown);
  EXPECT_EQ(run.breakdown->steps, 2);  // rank 1's step is not rank 0's
}

TEST(ReadRun, LabelIsTheDirectoryAsGivenWithoutTrailingSlash) {
  TempDir dir("report_label");
  engine::testing::write_run(dir.path(), 0, false);
  EXPECT_EQ(read_run(dir.path().string() + "/").label, dir.path().string());
  EXPECT_FALSE(read_run(dir.path()).breakdown);
}

TEST(ReadRun, OnlyMetricsAreRequiredAndAnyKeyMayBeAbsent) {
  TempDir dir("report_minimal");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 3.5}\n\n{\"step\": 2, \"loss\": 3.0}\n";
  const RunData run = read_run(dir.path());
  EXPECT_EQ(run.find("loss")->values, (std::vector<double>{3.5, 3.0}));
  EXPECT_EQ(run.find("lr"), nullptr);
  EXPECT_TRUE(run.val_loss.empty());
  EXPECT_TRUE(run.summary.empty());
  EXPECT_TRUE(run.recipe_text.empty());
}

std::string error_of(const std::filesystem::path& dir) {
  try {
    read_run(dir);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ReadRun, ABadLineNamesFileAndLine) {
  TempDir dir("report_bad");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 3.5}\n{\"step\": 2, \"loss\": 3.\n";
  const std::string message = error_of(dir.path());
  EXPECT_NE(message.find((dir / "metrics.jsonl").string() + ":2: not a JSON line"), std::string::npos) << message;

  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n[1, 2]\n";
  EXPECT_NE(error_of(dir.path()).find("metrics.jsonl:2: expected a JSON object"), std::string::npos);
  std::ofstream(dir / "metrics.jsonl") << "{\"loss\": 1}\n";
  EXPECT_NE(error_of(dir.path()).find("metrics.jsonl:1: no numeric \"step\""), std::string::npos);
}

TEST(ReadRun, MissingDirectoryOrMetricsIsAUserError) {
  TempDir dir("report_missing");
  EXPECT_NE(error_of(dir / "nope").find("run directory not found: " + (dir / "nope").string()), std::string::npos);
  EXPECT_NE(error_of(dir.path()).find("no metrics.jsonl in " + dir.path().string()), std::string::npos);
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n";
  std::ofstream(dir / "trace.json") << "{\"traceEvents\": [";
  EXPECT_NE(error_of(dir.path()).find("trace.json: not valid JSON"), std::string::npos);
}

TEST(Breakdown, SplitsRankZerosStepsByCategoryAndOp) {
  TempDir dir("report_breakdown");
  engine::testing::write_run(dir.path());
  const Breakdown b = *read_run(dir.path()).breakdown;
  EXPECT_DOUBLE_EQ(b.step_ms, 100);
  std::map<std::string, double> ms;
  double percent = 0;
  for (const auto& row : b.categories) {
    ms[row.name] = row.ms_per_step;
    percent += row.percent;
  }
  EXPECT_DOUBLE_EQ(ms["op"], 52.5);
  EXPECT_DOUBLE_EQ(ms["data"], 5);
  EXPECT_DOUBLE_EQ(ms["communication"], 12);
  EXPECT_DOUBLE_EQ(ms["optimizer"], 20);
  EXPECT_DOUBLE_EQ(ms["untraced"], 10.5);
  EXPECT_NEAR(percent, 100, 1e-9);             // the categories and the untraced rest make up the step
  EXPECT_EQ(b.categories.front().name, "op");  // largest first

  // 14 ops: the 12 largest, then the other two together.
  ASSERT_EQ(b.ops.size(), 13u);
  EXPECT_EQ(b.ops.front().name, "op0");
  EXPECT_DOUBLE_EQ(b.ops.front().ms_per_step, 7);
  EXPECT_EQ(b.ops.back().name, "other ops");
  EXPECT_DOUBLE_EQ(b.ops.back().ms_per_step, 1.0 + 0.5);  // op12 and op13
  double op_ms = 0;
  for (const auto& row : b.ops) op_ms += row.ms_per_step;
  EXPECT_DOUBLE_EQ(op_ms, ms["op"]);
}

TEST(Breakdown, NestedEventsCountOnceAndOtherRanksNotAtAll) {
  using Json = nlohmann::json;
  auto x = [](const char* name, const char* cat, double ts, double dur, int pid = 0) {
    return Json{{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", pid}, {"tid", 0}};
  };
  const Json trace{{"traceEvents",
                    {x("step 1", "step", 0, 1000), x("save", "checkpoint", 100, 500), x("linear", "op", 200, 100),
                     x("linear", "op", 700, 100), x("linear", "op", 2000, 100), x("gelu", "op", 700, 5000, 1)}}};
  const Breakdown b = *compute_breakdown(trace, "trace.json");
  ASSERT_EQ(b.categories.size(), 3u);
  EXPECT_EQ(b.categories[0].name, "checkpoint");
  EXPECT_DOUBLE_EQ(b.categories[0].ms_per_step, 0.5);  // its op inside is not counted twice
  EXPECT_EQ(b.categories[1].name, "untraced");
  EXPECT_DOUBLE_EQ(b.categories[1].ms_per_step, 0.4);
  EXPECT_DOUBLE_EQ(b.categories[2].ms_per_step, 0.1);  // the op outside the checkpoint; not the one after the step
  ASSERT_EQ(b.ops.size(), 1u);
  EXPECT_DOUBLE_EQ(b.ops[0].ms_per_step, 0.2);
  EXPECT_FALSE(compute_breakdown(Json{{"traceEvents", Json::array()}}, "t"));
  EXPECT_THROW(compute_breakdown(Json{{"events", 1}}, "t"), UserError);
}

}  // namespace
}  // namespace engine::report
