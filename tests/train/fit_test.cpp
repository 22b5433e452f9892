// Fitting a run to the machine, through the engine binary: a run under a small address-space limit
// is a user error that names the limit (exit 2, never "internal error"), and `engine plan --fit`
// proposes a configuration that fits the budgets, which `engine plan` then confirms.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../shell.h"
#include "../temp_dir.h"
#include "recipe/load.h"
#include "trainer/fit.h"
#include "trainer/session.h"

namespace {

namespace fs = std::filesystem;
using engine::testing::TempDir;
const fs::path kSource = ENGINE_SOURCE_DIR;
const std::string kRecipe = "bench/gpt-bench.yaml";

using Result = engine::testing::ShellResult;

// Runs a shell command in the source directory.
Result run_shell(const std::string& shell_command) { return engine::testing::run_shell(shell_command, kSource); }

Result run(const std::string& args) { return run_shell("OMP_NUM_THREADS=1 '" ENGINE_BINARY "' " + args); }

// `engine train` under `ulimit -v kib`.
Result train_under_ulimit(int64_t kib, const fs::path& output_dir) {
  return run_shell("OMP_NUM_THREADS=1 bash -c \"ulimit -v " + std::to_string(kib) +
                   "; exec '" ENGINE_BINARY "' train " + kRecipe +
                   " train.steps=2 run.output_dir=" + output_dir.string() + "\"");
}

// The least `ulimit -v` (KiB, to 16 MiB) under which the engine starts at all: its libraries'
// mappings (a CUDA build maps cuBLASLt and cuDNN, about 0.7 GB of address space, before main). The
// limits below are this floor plus what each test means to allow.
int64_t engine_floor_kib() {
  static const int64_t floor = [] {
    int64_t low = 0, high = int64_t(8) << 20;  // 8 GiB starts any build
    while (high - low > (int64_t(16) << 10)) {
      const int64_t mid = (low + high) / 2;
      const Result r =
          run_shell("bash -c \"ulimit -v " + std::to_string(mid) + "; exec '" ENGINE_BINARY "' --version\"");
      (r.status == 0 ? high : low) = mid;
    }
    return high;
  }();
  return floor;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The line after "fastest that fits:" or "nothing fits": the proposed command.
std::string proposed_command(const std::string& output) {
  std::istringstream lines(output);
  std::string line;
  bool next = false;
  while (std::getline(lines, line)) {
    if (next) return line.substr(line.find_first_not_of(' '));
    next = line.rfind("fastest that fits:", 0) == 0 || line.rfind("nothing fits", 0) == 0;
  }
  return "";
}

TEST(OutOfMemory, ASmallAddressSpaceLimitIsAUserErrorNamingIt) {
  TempDir out("fit_oom");
  // 400 MB past the engine's own floor: the benchmark GPT's plan (~1.6 GB with its checkpoint
  // snapshot) does not fit.
  const Result r = train_under_ulimit(engine_floor_kib() + 400000, out.path());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ulimit -v (RLIMIT_AS)")) << r.output;
  EXPECT_FALSE(contains(r.output, "This is a bug")) << r.output;
  EXPECT_FALSE(contains(r.output, "internal error")) << r.output;
}

// The plan fits, then loading 400 MB of tokens (800 MB once widened) does not: the std::bad_alloc
// inside the session's construction is a user error naming the limit.
TEST(OutOfMemory, AnAllocationThatFailsAfterThePlanFittedIsAUserError) {
  TempDir dir("fit_bad_alloc");
  const fs::path tokens = dir / "tokens.bin";
  { std::ofstream(tokens).put('\0'); }
  fs::resize_file(tokens, 400 << 20);  // sparse: no disk space used
  const Result r =
      run_shell("OMP_NUM_THREADS=1 bash -c \"ulimit -v " + std::to_string(engine_floor_kib() + 600000) +
                "; exec '" ENGINE_BINARY "' train " + kRecipe +
                " model.vocab_size=256 model.n_layer=1 model.n_embd=64 model.n_head=2 data.source=tokens"
                " data.path=" +
                tokens.string() + " '~data.order' train.steps=2 run.output_dir=" + (dir / "runs").string() + "\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "out of memory: an allocation failed")) << r.output;
  EXPECT_TRUE(contains(r.output, "the limit in force is ulimit -v (RLIMIT_AS)")) << r.output;
  EXPECT_FALSE(contains(r.output, "internal error")) << r.output;
}

// Each row of the search for the benchmark GPT, planned in process to choose the budgets.
class Fit : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine::recipe::LoadOptions options;
    options.overrides = {"run.output_dir=unused"};
    const auto loaded = engine::recipe::load_recipe(kSource / kRecipe, options);
    rows_ = new std::vector<engine::FitRow>(engine::fit_rows(kSource / kRecipe, options, loaded, {}).rows);
  }
  static void TearDownTestSuite() { delete rows_; }
  // The least host memory of the rows with (true) or without swap files.
  static int64_t least_host(bool with_swap) {
    int64_t least = INT64_MAX;
    for (const engine::FitRow& row : *rows_)
      if ((row.swap_needed > 0) == with_swap) least = std::min(least, row.host_needed);
    return least;
  }
  static std::vector<engine::FitRow>* rows_;
};
std::vector<engine::FitRow>* Fit::rows_ = nullptr;

TEST_F(Fit, ABudgetOnlyOffloadToNvmeFitsGetsItProposedAndThePlanConfirmsIt) {
  const int64_t budget = least_host(true);
  ASSERT_LT(budget, least_host(false)) << "offload to nvme should need the least host memory";
  const std::string budgets = " --host-memory " + std::to_string(budget) + " --nvme 1TiB";
  const Result fit = run("plan " + kRecipe + " --fit" + budgets);
  ASSERT_EQ(fit.status, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "fastest that fits:")) << fit.output;
  const std::string command = proposed_command(fit.output);
  ASSERT_EQ(command.rfind("engine train " + kRecipe + " ", 0), 0u) << fit.output;
  EXPECT_TRUE(contains(command, "offload.optimizer=nvme")) << command;

  // The proposal, passed to `engine plan` with the same budgets: the recipe as given now fits.
  const std::string overrides = command.substr(std::string("engine train").size());
  const Result confirm = run("plan" + overrides + budgets);
  ASSERT_EQ(confirm.status, 0) << confirm.output;
  EXPECT_TRUE(contains(confirm.output, "the recipe as given fits:")) << confirm.output;
  // And without them it does not.
  const Result before = run("plan " + kRecipe + budgets);
  EXPECT_TRUE(contains(before.output, "the recipe as given does not fit:")) << before.output;
}

// A budget the recipe fits only without its checkpoint snapshot: the proposal keeps the recipe and
// writes its checkpoints straight from the state (checkpoint.async=false), which `engine plan`
// then confirms.
TEST_F(Fit, ABudgetOnlyTheSnapshotExceedsProposesSynchronousCheckpoints) {
  const engine::FitRow& recipe = rows_->front();
  ASSERT_TRUE(recipe.is_recipe);
  ASSERT_LT(recipe.host_needed_streamed, recipe.host_needed) << "the snapshot is in the recipe's need";
  const std::string budgets = " --host-memory " + std::to_string(recipe.host_needed_streamed) + " --nvme 1TiB";
  const Result fit = run("plan " + kRecipe + " --fit" + budgets);
  ASSERT_EQ(fit.status, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "with checkpoint.async=false, no checkpoint snapshot held")) << fit.output;
  const std::string command = proposed_command(fit.output);
  EXPECT_EQ(command, "engine train " + kRecipe + " checkpoint.async=false") << fit.output;
  const Result confirm = run("plan" + command.substr(std::string("engine train").size()) + budgets);
  ASSERT_EQ(confirm.status, 0) << confirm.output;
  EXPECT_TRUE(contains(confirm.output, "the recipe as given fits:")) << confirm.output;
  const Result before = run("plan " + kRecipe + budgets);
  EXPECT_TRUE(contains(before.output, "the recipe as given does not fit:")) << before.output;
}

TEST_F(Fit, ABudgetNothingFitsSaysSoAndNamesTheClosest) {
  const Result r = run("plan " + kRecipe + " --fit --host-memory 1MiB --nvme 1TiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing fits these budgets. The closest is")) << r.output;
  EXPECT_FALSE(contains(r.output, "fastest that fits")) << r.output;
  EXPECT_EQ(proposed_command(r.output).rfind("engine train " + kRecipe, 0), 0u) << r.output;
}

// Enough host memory for the offloaded rows only, but no room for their swap files.
TEST_F(Fit, TheNvmeBudgetBindsToo) {
  const Result r = run("plan " + kRecipe + " --fit --host-memory " + std::to_string(least_host(true)) + " --nvme 1MiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing fits these budgets")) << r.output;
  EXPECT_TRUE(contains(r.output, "no: nvme")) << r.output;
}

TEST_F(Fit, TheRecipeFitsAnAmpleBudgetAsItIs) {
  const Result r = run("plan " + kRecipe + " --fit --host-memory 1TiB --nvme 1TiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(proposed_command(r.output), "engine train " + kRecipe) << r.output;
}

TEST_F(Fit, SizesThatAreNotSizesAreUserErrors) {
  const Result r = run("plan " + kRecipe + " --fit --host-memory 12XB");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--host-memory 12XB: not a size")) << r.output;
}

TEST_F(Fit, DeviceMemoryIsAHostBudgetOnTheCpu) {
  const Result r = run("plan " + kRecipe + " run.device=cpu --fit --device-memory 1MiB --nvme 1TiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the device is the host")) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing fits these budgets")) << r.output;
  const Result automatic = run("plan " + kRecipe + " run.device=cpu --fit --device-memory auto");
  EXPECT_EQ(automatic.status, 2) << automatic.output;
  EXPECT_TRUE(contains(automatic.output, "--device-memory auto: this run trains on the CPU")) << automatic.output;
}

// Over 4 ranks the search plans every T x P x D layout the model splits into (the benchmark GPT with a
// vocabulary of 50304 rows: T = 2 divides its 6 heads, P = 2 and 4 its 6 blocks), each row from every
// stage's plan with the global batch kept. A host budget that only a split layout meets without swap
// gets it proposed, and `engine plan` of the proposal confirms it fits.
TEST_F(Fit, OverSeveralRanksTheLayoutsAreSearchedAndASplitOneProposed) {
  const std::string recipe = kRecipe + " model.vocab_size=50304 run.output_dir=unused";
  engine::recipe::LoadOptions options;
  options.overrides = {"model.vocab_size=50304", "run.output_dir=unused"};
  options.world = {4, "test"};
  const auto loaded = engine::recipe::load_recipe(kSource / kRecipe, options);
  const engine::FitSearch search = engine::fit_rows(kSource / kRecipe, options, loaded, {});
  ASSERT_TRUE(search.layouts);
  std::set<std::string> layouts;
  int64_t least_split = INT64_MAX, least_whole = INT64_MAX;
  for (const engine::FitRow& row : search.rows) {
    layouts.insert(row.layout_name());
    EXPECT_EQ(row.tensor * row.pipeline * row.data, 4) << row.layout_name();
    EXPECT_EQ(row.micro * row.accumulation * row.data, 32) << row.layout_name() << ": the global batch";
    if (row.swap_needed > 0) continue;
    int64_t& least = row.tensor * row.pipeline > 1 ? least_split : least_whole;
    least = std::min(least, row.host_needed);
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"1 x 1 x 4", "1 x 2 x 2", "1 x 4 x 1", "2 x 1 x 2", "2 x 2 x 1"}));
  ASSERT_LT(least_split, least_whole) << "a split layout should need the least host memory without swap";

  const std::string budgets = " --world-size 4 --host-memory " + std::to_string(least_split) + " --nvme 1MiB";
  const Result fit = run("plan " + recipe + " --fit" + budgets);
  ASSERT_EQ(fit.status, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "fastest that fits: layout T x P x D")) << fit.output;
  const std::string command = proposed_command(fit.output);
  EXPECT_TRUE(contains(command, "distributed.tensor_parallel=") || contains(command, "distributed.pipeline_parallel="))
      << command;
  const Result confirm = run("plan" + command.substr(std::string("engine train").size()) + budgets);
  ASSERT_EQ(confirm.status, 0) << confirm.output;
  EXPECT_TRUE(contains(confirm.output, "the recipe as given fits:")) << confirm.output;

  // A recipe that lists its stages' blocks (recipes/examples/gpt-3d-parallel.yaml, 2 + 2): the
  // layouts of other stage counts drop the list rather than being refused for it.
  engine::recipe::LoadOptions listed;
  listed.overrides = {"run.output_dir=unused"};
  listed.world = {8, "test"};
  const fs::path example = kSource / "recipes/examples/gpt-3d-parallel.yaml";
  const engine::FitSearch cut = engine::fit_rows(example, listed, engine::recipe::load_recipe(example, listed), {});
  for (const std::string& note : cut.notes) ADD_FAILURE() << note;
  std::set<int> stage_counts;
  for (const engine::FitRow& row : cut.rows) stage_counts.insert(row.pipeline);
  EXPECT_EQ(stage_counts, (std::set<int>{1, 2, 4})) << "the layouts of 8 ranks over 4 blocks";

  // A split recipe without a world size: one data-parallel rank of its layout, searched alone.
  const Result alone = run("plan " + recipe + " distributed.tensor_parallel=2 --fit --host-memory 1TiB --nvme 1TiB");
  ASSERT_EQ(alone.status, 0) << alone.output;
  EXPECT_EQ(proposed_command(alone.output), "engine train " + recipe + " distributed.tensor_parallel=2")
      << alone.output;
}

// A GPU run's rows (planned on any machine: planning needs no device) carry the device memory
// plan: ZeRO-Offload (cpu) joins nvme, and a device budget that only the least device plan meets
// gets that row proposed, which `engine plan` then confirms.
TEST_F(Fit, OnAGpuTheDeviceBudgetPicksTheRowAndThePlanConfirmsIt) {
  engine::recipe::LoadOptions options;
  options.overrides = {"run.output_dir=unused", "run.device=cuda"};
  const auto loaded = engine::recipe::load_recipe(kSource / kRecipe, options);
  const engine::FitSearch search = engine::fit_rows(kSource / kRecipe, options, loaded, {});
  ASSERT_TRUE(search.device);
  int64_t least = INT64_MAX, resident = 0;
  bool cpu_offload = false;
  for (const engine::FitRow& row : search.rows) {
    EXPECT_GT(row.device, 0) << row.offload_name();
    least = std::min(least, row.device);
    if (row.is_recipe) resident = row.device;
    cpu_offload = cpu_offload || row.optimizer == engine::OffloadTier::cpu;
  }
  EXPECT_TRUE(cpu_offload) << "ZeRO-Offload rows";
  ASSERT_LT(least, resident) << "a staged row holds less on the device than the resident recipe";

  const std::string budgets = " --device-memory " + std::to_string(least) + " --host-memory 1TiB --nvme 1TiB";
  const Result fit = run("plan " + kRecipe + " run.device=cuda --fit" + budgets);
  ASSERT_EQ(fit.status, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "fastest that fits:")) << fit.output;
  EXPECT_TRUE(contains(fit.output, "of device memory per GPU")) << fit.output;
  const std::string command = proposed_command(fit.output);
  EXPECT_TRUE(contains(command, "distributed.zero_stage=3")) << command;
  const Result confirm = run("plan" + command.substr(std::string("engine train").size()) + budgets);
  ASSERT_EQ(confirm.status, 0) << confirm.output;
  EXPECT_TRUE(contains(confirm.output, "the recipe as given fits:")) << confirm.output;
  const Result before = run("plan " + kRecipe + " run.device=cuda" + budgets);
  EXPECT_TRUE(contains(before.output, "the recipe as given does not fit:")) << before.output;
}

// A staged GPU row (offload) moves the parameters up once a step, after the host's update (ZeRO-3
// gathers them for the forward and again for the backward of every micro-batch), and every
// micro-batch's gradients down: what the runner does (DeviceRunner::parameters_changed).
TEST_F(Fit, AStagedGpuRowMovesTheParametersOnceAStepAndTheGradientsEveryMicroBatch) {
  engine::recipe::LoadOptions options;
  options.overrides = {"run.output_dir=unused", "run.device=cuda"};
  const auto loaded = engine::recipe::load_recipe(kSource / kRecipe, options);
  const engine::FitSearch search = engine::fit_rows(kSource / kRecipe, options, loaded, {});
  const engine::Graph& g = engine::compile_step(loaded.recipe).model.graph;
  const auto parameters = double(g.param_count()) * double(engine::dtype_size(g.param_dtype()));
  const auto gradients = double(g.param_count()) * double(engine::dtype_size(g.grad_dtype()));
  int accumulating = 0;
  for (const engine::FitRow& row : search.rows) {
    if (row.link_moved == 0) continue;  // resident
    const auto accumulation = double(row.accumulation);
    const double up = row.stage == 3 ? 2 * parameters * accumulation : parameters;
    EXPECT_EQ(row.link_moved, int64_t(up + gradients * accumulation))
        << row.offload_name() << " stage " << row.stage << " accumulating " << row.accumulation;
    accumulating += row.stage < 3 && row.accumulation > 1;
  }
  EXPECT_GT(accumulating, 0) << "a staged row at stages 0-2 that accumulates";
}

}  // namespace
