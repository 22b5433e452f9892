// Training end to end: determinism, the quick start reaching its loss floor, and the memory plan
// against the measured peak resident memory of a real `engine train` process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../equivalence/run_util.h"
#include "../temp_dir.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "optim/optimizer.h"
#include "recipe/load.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
const fs::path kSource = ENGINE_SOURCE_DIR;

using testing::quickstart;
using testing::run;
using Trace = testing::Run;

TEST(Determinism, SameRecipeGivesBitIdenticalLossesAndWeights) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
    SCOPED_TRACE(arch);
    auto loaded = quickstart({arch, "~model.bias", "train.gradient_accumulation_steps=2", "train.micro_batch_size=8"});
    Trace a = run(loaded.recipe, 15), b = run(loaded.recipe, 15);
    ASSERT_EQ(a.losses.size(), b.losses.size());
    for (size_t i = 0; i < a.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0) << "step " << i;
    for (size_t p = 0; p < a.weights.size(); ++p)
      EXPECT_EQ(std::memcmp(a.weights[p].data(), b.weights[p].data(), a.weights[p].size() * 4), 0) << "param " << p;
    EXPECT_LT(a.losses.back(), a.losses.front());  // and it learns
  }
}

// docs/golden-tests.md promises bit-for-bit reproduction whatever the thread count: the same
// recipe with 1, 2 and 3 OpenMP threads (3 does not divide the work evenly) gives the same bits.
// The promise covers the engine's kernels and oneDNN's AVX-512 ones; oneDNN's AVX2 sgemm blocks
// its sums by thread count, which the golden bands measure instead.
TEST(Determinism, ThreadCountDoesNotChangeABit) {
  // dnnl_cpu_isa_t values are bit sets: an ISA includes AVX-512 when it has all of its bits.
  const unsigned isa = dnnl_get_effective_cpu_isa(), avx512 = dnnl_cpu_isa_avx512_core;
  if ((isa & avx512) != avx512)
    GTEST_SKIP() << "oneDNN runs its AVX2 sgemm here, whose rounding depends on the thread count";
  const int saved = omp_get_max_threads();
  for (const char* precision : {"precision.mode=fp32", "precision.mode=bf16"})
    for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
      SCOPED_TRACE(std::string(arch) + " " + precision);
      auto loaded = quickstart({arch, precision, "train.gradient_accumulation_steps=2", "train.micro_batch_size=8"});
      omp_set_num_threads(1);
      Trace one = run(loaded.recipe, 6);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        Trace t = run(loaded.recipe, 6);
        for (size_t i = 0; i < one.losses.size(); ++i)
          EXPECT_EQ(std::memcmp(&one.losses[i], &t.losses[i], sizeof(double)), 0)
              << threads << " threads, step " << i << ": " << t.losses[i] << " vs " << one.losses[i];
        for (size_t p = 0; p < one.weights.size(); ++p)
          EXPECT_EQ(std::memcmp(one.weights[p].data(), t.weights[p].data(), one.weights[p].size() * 4), 0)
              << threads << " threads, param " << p;
      }
    }
  omp_set_num_threads(saved);
}

TEST(Quickstart, EndsWithinATenthOfANatOfTheEntropyFloor) {
  const testing::TempDir scratch("quickstart");
  const fs::path& out = scratch.path();
  auto loaded = quickstart({"run.output_dir=" + out.string()});
  std::ostringstream log;
  TrainSummary summary = train(loaded, log);
  std::ifstream in(summary.run_dir / "summary.json");
  nlohmann::json s = nlohmann::json::parse(in);
  double floor = s["loss_floor"];
  double val = s["final_val_loss"];
  EXPECT_GT(floor, 0);
  EXPECT_LT(val - floor, 0.1) << log.str();
  EXPECT_GT(val - floor, -0.05) << "a loss well below the exact floor means the floor or the loss is wrong";
  EXPECT_TRUE(fs::exists(summary.run_dir / "model.safetensors"));
  EXPECT_TRUE(fs::exists(summary.run_dir / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(summary.run_dir / "recipe.yaml"));
}

TEST(MemoryPlan, PredictsThePeakResidentMemoryOfARealRun) {
  // A model whose planned memory (~270 MB, mostly activations and the LM head's logits) dwarfs
  // the process's own footprint, trained for two steps by the real binary.
  // One OpenMP thread: the plan counts the step's memory (weights, gradients, optimizer state, the
  // activation arena), which does not depend on the thread count; each extra thread adds its own
  // stack, malloc arena and oneDNN scratch outside the plan, so the measured/planned ratio grew
  // from 1.04 at 1 thread to 1.17 at 16 and the test's outcome depended on the machine it ran on.
  const testing::TempDir scratch("memory");
  const fs::path& out = scratch.path();
  std::string command = "OMP_NUM_THREADS=1 '" ENGINE_BINARY "' train '" +
                        (kSource / "recipes/quickstart.yaml").string() + "' run.output_dir=" + out.string() +
                        " train.steps=2 scheduler.warmup_steps=0 train.eval_every=0 model.vocab_size=8192 "
                        "model.n_embd=256 model.n_layer=4"
                        " model.context_length=256 train.micro_batch_size=16 data.vocab_size=64 > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out / "quickstart" / "summary.json");
  nlohmann::json s = nlohmann::json::parse(in);
  double planned = s["planned_bytes"], baseline = s["baseline_rss_bytes"], peak = s["peak_rss_bytes"];
  double measured = peak - baseline;
  RecordProperty("planned_mb", std::to_string(planned / 1e6));
  RecordProperty("measured_mb", std::to_string(measured / 1e6));
  // Stated tolerance: the planned bytes are within 10% of the growth in peak resident memory
  // (the remainder is the loader's prefetched batches, oneDNN's scratch and the heap).
  EXPECT_NEAR(measured / planned, 1.0, 0.10) << "planned " << planned << " measured " << measured;
}

}  // namespace
}  // namespace engine

namespace engine {
namespace {

TEST(Interrupt, CtrlCFinishesTheStepWritesACheckpointAndAsksForARequeue) {
  const testing::TempDir scratch("interrupt");
  const fs::path& out = scratch.path();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string output_dir = "run.output_dir=" + out.string();
    std::string recipe = (kSource / "recipes/quickstart.yaml").string();
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::execl(ENGINE_BINARY, ENGINE_BINARY, "train", recipe.c_str(), output_dir.c_str(), "train.steps=1000000",
            "train.log_every=1", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait until training has logged a step, then interrupt.
  fs::path metrics = out / "quickstart" / "metrics.jsonl";
  for (int i = 0; i < 600 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i) ::usleep(50'000);
  ASSERT_TRUE(fs::exists(metrics));
  ::kill(child, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal instead of stopping cleanly";
  EXPECT_EQ(WEXITSTATUS(status), 75);  // requeue
  std::ifstream in(out / "quickstart" / "summary.json");
  nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_TRUE(s["interrupted"].get<bool>());
  EXPECT_TRUE(s["preempted"].get<bool>());
  const int64_t steps = s["steps"].get<int64_t>();
  EXPECT_LT(steps, 1000000);
  // The step the run stopped after is committed, and nothing half-written is left.
  const fs::path checkpoint = out / "quickstart" / "checkpoints" / ("step-" + std::to_string(steps));
  EXPECT_EQ(s["last_checkpoint"].get<std::string>(), checkpoint.string());
  EXPECT_TRUE(fs::exists(checkpoint / "manifest.json"));
  EXPECT_TRUE(fs::exists(checkpoint / "rank-00000.bin"));
  EXPECT_FALSE(fs::exists(out / "quickstart" / "checkpoints" / (".tmp-step-" + std::to_string(steps))));
}

}  // namespace
}  // namespace engine

namespace engine {
namespace {

TEST(Schedule, DecaysTowardMinLrWithoutReachingItOnTheLastStep) {
  auto r = quickstart({"train.steps=10", "scheduler.warmup_steps=2", "scheduler.type=linear", "scheduler.min_lr=0.0",
                       "optimizer.lr=1.0"})
               .recipe;
  EXPECT_DOUBLE_EQ(learning_rate(r, 0), 0.5);  // warmup: (step + 1) / warmup_steps
  EXPECT_DOUBLE_EQ(learning_rate(r, 1), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(r, 2), 1.0);    // decay starts at the peak
  EXPECT_DOUBLE_EQ(learning_rate(r, 9), 0.125);  // 7 of 8 decay steps done: not yet min_lr
  auto one =
      quickstart({"train.steps=1", "scheduler.warmup_steps=0", "scheduler.type=cosine", "optimizer.lr=1.0"}).recipe;
  EXPECT_DOUBLE_EQ(learning_rate(one, 0), 1.0) << "a single step must still learn";
}

// --dump-gradients-at STEP PATH: each listed step's gradients land in their own file (the parity
// tests compare step 1 and step 4 with PyTorch); a step outside the run is refused up front.
TEST(GradientDump, WritesTheListedStepsAndRefusesStepsOutsideTheRun) {
  const testing::TempDir scratch("gradients");
  auto loaded = quickstart(
      {"run.output_dir=" + scratch.path().string(), "train.steps=3", "scheduler.warmup_steps=1", "train.eval_every=0"});
  std::ostringstream log;
  TrainOptions options;
  options.first_gradients = scratch / "first.safetensors";
  options.gradients_at = {{1, scratch / "1.safetensors"}, {3, scratch / "3.safetensors"}};
  train(loaded, log, options);
  auto first = read_safetensors(scratch / "first.safetensors"), one = read_safetensors(scratch / "1.safetensors"),
       three = read_safetensors(scratch / "3.safetensors");
  ASSERT_FALSE(one.tensors.empty());
  ASSERT_EQ(one.tensors.size(), three.tensors.size());
  EXPECT_EQ(one.tensors.at("wte.weight").data, first.tensors.at("wte.weight").data);
  EXPECT_NE(one.tensors.at("wte.weight").data, three.tensors.at("wte.weight").data) << "step 3's are step 1's";
  EXPECT_FALSE(fs::exists(scratch / "2.safetensors"));

  options.gradients_at = {{4, scratch / "4.safetensors"}};
  try {
    train(loaded, log, options);
    FAIL() << "a step past train.steps was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("between 1 and train.steps (3)"), std::string::npos) << e.what();
  }
}

TEST(Divergence, ANonFiniteLossStopsTheRunWithAClearError) {
  const testing::TempDir scratch("divergence");
  const fs::path& out = scratch.path();
  auto loaded = quickstart({"run.output_dir=" + out.string(), "optimizer.lr=1e30", "scheduler.min_lr=1e30",
                            "scheduler.warmup_steps=0", "train.steps=30", "train.gradient_clipping=0"});
  std::ostringstream log;
  try {
    train(loaded, log);
    FAIL() << "a diverging run finished";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged at step"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out / "quickstart" / "model.safetensors"));
}

}  // namespace
}  // namespace engine
