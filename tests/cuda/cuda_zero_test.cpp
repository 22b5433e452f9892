// ZeRO and offload on a GPU, checked by running both sides with the engine binary: every ZeRO
// stage (resident: the gathers and reduce-scatters on the device where the plan places them), every
// staged setting (trainer/device.h: ZeRO-Offload to host memory or NVMe) and several ranks sharing
// the GPU train to the same bits as the resident run on one process at stage 0: its per-step
// losses, gradient norms and learning rates, and its final weights file.
// fp32 and bf16 with accumulation, clipping, dropout and evaluation every other step (ZeRO-3 gathers
// for the evaluation plan too). Skipped, saying so, without a device; the
// two-rank case also without a working mpirun (ENGINE_MPIRUN, else the build's).
// The resident run's device collectives (distributed.gpu_collectives: NCCL, and the staged
// communicator that lets two ranks share the GPU) give the same bits as one process summing alone.
// A rank stopped mid-step on the GPU is named within distributed.timeout.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../equivalence/run_util.h"
#include "../rank_signal.h"
#include "../shell.h"
#include "../temp_dir.h"
#include "core/build_flags.h"
#include "core/device_info.h"
#include "require_cuda_device.h"
#include "telemetry/measurements.h"
#include "trainer/device.h"

namespace engine::testing {
namespace {

struct Trajectory {
  std::vector<std::string> steps;  // the deterministic fields of each metrics line
  std::string weights;             // the final model.safetensors, byte for byte
  std::string output;
};

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `launcher` is empty for one process, else "mpirun ... -n 2 ".
Trajectory train(const std::string& launcher, const std::string& overrides, const std::filesystem::path& dir) {
  const std::string command = launcher + "'" ENGINE_BINARY "' train recipes/quickstart.yaml run.device=cuda " +
                              "train.steps=4 train.log_every=1 train.eval_every=2 model.dropout=0.1 " +
                              "train.gradient_clipping=0.5 run.name=run run.output_dir=" + dir.string() + " " +
                              overrides;
  const ShellResult result = run_shell(command, ENGINE_SOURCE_DIR);
  Trajectory t;
  t.output = command + "\n" + result.output;
  EXPECT_EQ(result.status, 0) << t.output;
  // Every phase replays as CUDA graphs (stream_graphs_cuda.cpp warns where a capture fails and runs
  // it eagerly, which would give the same bits and hide the failure).
  EXPECT_EQ(t.output.find("cannot be captured as a CUDA graph"), std::string::npos) << t.output;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    t.steps.push_back(without_measurements(nlohmann::json::parse(line)).dump());
  t.weights = read_bytes(dir / "run" / "model.safetensors");
  EXPECT_FALSE(t.weights.empty()) << t.output;
  return t;
}

// The fields `want`'s lines carry, from `got`'s (offload adds its own counters).
std::vector<std::string> fields_of(const Trajectory& got, const Trajectory& want) {
  std::vector<std::string> out;
  for (size_t i = 0; i < got.steps.size() && i < want.steps.size(); ++i) {
    const nlohmann::json wanted = nlohmann::json::parse(want.steps[i]), line = nlohmann::json::parse(got.steps[i]);
    nlohmann::json kept = nlohmann::json::object();
    for (auto it = wanted.begin(); it != wanted.end(); ++it)
      if (line.contains(it.key())) kept[it.key()] = line[it.key()];
    out.push_back(kept.dump());
  }
  return out;
}

void expect_same(const Trajectory& got, const Trajectory& want, const std::string& what) {
  ASSERT_EQ(got.steps.size(), want.steps.size()) << what << "\n" << got.output;
  EXPECT_EQ(fields_of(got, want), want.steps) << what << "\n" << got.output;
  EXPECT_TRUE(got.weights == want.weights) << what << ": the final weights differ\n" << got.output;
}

const char* const kPrecisions[] = {"precision.mode=fp32", "precision.mode=bf16"};

// The launcher the two-rank tests use (ENGINE_MPIRUN, else the build's), or empty where it does
// not start two ranks.
std::string configured_mpirun() {
  const char* configured = std::getenv("ENGINE_MPIRUN");
  return configured ? configured : MPIEXEC;
}
std::string two_rank_mpirun() {
  const std::string mpirun = configured_mpirun();
  const ShellResult probe = run_shell("'" + mpirun + "' --allow-run-as-root --oversubscribe -n 2 true");
  if (probe.status != 0) std::fprintf(stderr, "%s", probe.output.c_str());
  return probe.status == 0 ? mpirun : std::string();
}

// One process: stage 0 resident (the device optimizer) against stages 2-3 (resident, the plan's
// gathers and sums on the device) and every staged setting.
TEST(CudaZero, EveryStageAndOffloadOnOneProcessGivesTheResidentRunsBits) {
  REQUIRE_CUDA_DEVICE();
  const TempDir dir("cuda_zero");
  for (const char* precision : kPrecisions) {
    const std::string common = std::string(precision) + " train.gradient_accumulation_steps=2 ";
    const Trajectory resident = train("", common + "distributed.zero_stage=0", dir.path() / "resident");
    ASSERT_EQ(resident.steps.size(), 6u) << resident.output;
    EXPECT_NE(resident.output.find("device: cuda"), std::string::npos) << resident.output;
    const std::string nvme = "offload.nvme_path=" + (dir.path() / "swap").string();
    for (int stage : {2, 3}) {
      const Trajectory sharded =
          train("", common + "distributed.zero_stage=" + std::to_string(stage), dir.path() / "sharded");
      EXPECT_NE(sharded.output.find("where the plan places it"), std::string::npos) << sharded.output;
      EXPECT_EQ(sharded.output.find("the step computes on the GPU"), std::string::npos) << sharded.output;
      expect_same(sharded, resident, std::string(precision) + " zero_stage " + std::to_string(stage));
    }
    for (const std::string& setting : std::vector<std::string>{
             "offload.optimizer=cpu",
             "distributed.zero_stage=2 offload.optimizer=cpu",
             "distributed.zero_stage=3 offload.optimizer=cpu offload.parameters=cpu",
             "distributed.zero_stage=1 offload.optimizer=nvme " + nvme,
             "distributed.zero_stage=3 offload.optimizer=nvme offload.parameters=nvme " + nvme,
         }) {
      const Trajectory staged = train("", common + setting, dir.path() / "staged");
      EXPECT_NE(staged.output.find("the step computes on the GPU"), std::string::npos) << staged.output;
      expect_same(staged, resident, std::string(precision) + " " + setting);
    }
  }
}

// One process whose micro-batches' gradients go through a device communicator anyway
// (distributed.gpu_collectives: NCCL's world-1 reduce-scatter and all-gather on the device, or the
// staged copies through the host): the bits of the resident run that sums them itself. Accumulating
// 2 at stage 0 and 3, where the plan's reduce-scatters (and stage 3's gathers) go through it; and
// accumulating 1 at stage 0, whose plan has no reductions (the micro-batch is reduced after it).
TEST(CudaZero, DeviceCollectivesOnOneProcessGiveTheResidentRunsBits) {
  REQUIRE_CUDA_DEVICE();
  const TempDir dir("cuda_zero_collectives");
  for (const char* precision : kPrecisions) {
    for (const std::string accumulation : {"2", "1"}) {
      const std::string common = std::string(precision) + " train.gradient_accumulation_steps=" + accumulation + " ";
      const Trajectory resident = train("", common, dir.path() / ("resident" + accumulation));
      ASSERT_EQ(resident.steps.size(), 6u) << resident.output;
      for (const auto& [path, said] : std::vector<std::pair<std::string, std::string>>{
               {"nccl", "through NCCL on the GPUs"}, {"staged", "through page-locked host memory"}}) {
        if (path == "nccl" && !kHaveNccl) continue;
        // Stage 3 gathers two clusters ahead: a unit read by two clusters (the tied head) has two
        // gathers in flight.
        for (const std::string stage : {"0", "3 distributed.prefetch=2"}) {
          if (accumulation == "1" && stage != "0") continue;
          const Trajectory reduced =
              train("", common + "distributed.zero_stage=" + stage + " distributed.gpu_collectives=" + path,
                    dir.path() / (path + stage.substr(0, 1) + accumulation));
          EXPECT_NE(reduced.output.find(said), std::string::npos) << reduced.output;
          expect_same(reduced, resident,
                      std::string(precision) + " accumulating " + accumulation + " zero_stage " + stage +
                          " gpu_collectives " + path);
        }
      }
    }
  }
}

// Two ranks sharing the one GPU (one micro-batch each), at every stage, against one process
// accumulating the same two micro-batches. Every stage is resident, its gradients reduced on the
// device through the staged communicator (stages 1-3: each rank updates its shard, the norm's
// partial sums gathered; stages 1-2 gather the parameters after the update, stage 3 where the plan
// uses each unit; stages 2-3 reduce-scatter each unit during the backward).
TEST(CudaZero, TwoRanksOnOneGpuAtEveryStageGiveOneProcesssBits) {
  REQUIRE_CUDA_DEVICE();
  const std::string mpirun = two_rank_mpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun (" << configured_mpirun() << ") does not start two ranks here";
  const std::string launcher = "'" + mpirun + "' --allow-run-as-root --oversubscribe -n 2 ";
  const TempDir dir("cuda_zero_w2");
  for (const char* precision : kPrecisions) {
    const Trajectory one =
        train("", std::string(precision) + " train.gradient_accumulation_steps=2", dir.path() / "one");
    ASSERT_EQ(one.steps.size(), 6u) << one.output;
    for (int stage = 0; stage <= 3; ++stage) {
      const Trajectory two =
          train(launcher,
                std::string(precision) +
                    " train.gradient_accumulation_steps=1 distributed.gpu_collectives=staged distributed.zero_stage=" +
                    std::to_string(stage),
                dir.path() / ("two" + std::to_string(stage)));
      EXPECT_NE(two.output.find("2 ranks"), std::string::npos) << two.output;
      // Resident, reducing through the staged communicator (what auto picks where the ranks share
      // the GPU, NCCL refusing that; named, so that a machine with two GPUs runs the same test).
      EXPECT_NE(two.output.find("reduced on the device through page-locked host memory"), std::string::npos)
          << two.output;
      expect_same(two, one, std::string(precision) + " world 2 stage " + std::to_string(stage));
    }
  }
}

// The resident ranks (every stage) accumulating two micro-batches each, against one process
// accumulating four: global micro-batches r and r + 2 reduced onto the sum in order, the shards
// gathered after the last. A model of about 900 norm partial sums, so the norm's chunks of 256
// cross units whose padding differs between one and two ranks (stage 1 gathers every rank's
// partial sums and drops the padding blocks on the device); fp16 with a scale that overflows,
// so the device's skip decisions are compared too.
TEST(CudaZero, TwoResidentRanksAccumulatingGiveOneProcesssBits) {
  REQUIRE_CUDA_DEVICE();
  const std::string mpirun = two_rank_mpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun (" << configured_mpirun() << ") does not start two ranks here";
  const std::string launcher = "'" + mpirun + "' --allow-run-as-root --oversubscribe -n 2 ";
  const TempDir dir("cuda_zero_w2a2");
  for (const std::string precision :
       {"precision.mode=fp32", "precision.mode=bf16", "precision.mode=fp16 precision.initial_scale_power=22"}) {
    const std::string model = precision + " model.n_embd=160 model.n_layer=3 ";
    const Trajectory four = train("", model + "train.gradient_accumulation_steps=4", dir.path() / "four");
    ASSERT_GE(four.steps.size(), 6u) << four.output;
    for (int stage = 0; stage <= 3; ++stage) {
      const Trajectory two_by_two =
          train(launcher, model + "train.gradient_accumulation_steps=2 distributed.zero_stage=" + std::to_string(stage),
                dir.path() / ("two_by_two" + std::to_string(stage)));
      EXPECT_NE(two_by_two.output.find("reduced on the device"), std::string::npos) << two_by_two.output;
      expect_same(two_by_two, four, precision + " world 2 accumulating 2, stage " + std::to_string(stage));
    }
  }
}

// Hang handling on the GPU as on CPU ranks: with two ranks sharing the GPU (a staged run, its
// collectives on the host communicator; and resident ones at stages 0 and 3, whose device
// collectives stage through it), a rank stopped mid-step is named by the other with the collective
// it did not reach, and the job ends non-zero within distributed.timeout (plus the launcher's
// teardown). The resident runs name the staged communicator, as auto picks it for a shared GPU, so
// that a machine with two GPUs checks the same wording.
TEST(CudaZero, AStoppedRankIsNamedWithinTheTimeout) {
  REQUIRE_CUDA_DEVICE();
  const std::string mpirun = two_rank_mpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun (" << configured_mpirun() << ") does not start two ranks here";
  constexpr double kTimeout = 3.0, kTeardownSlack = 3.0;
  for (const char* stage :
       {"distributed.zero_stage=2 offload.optimizer=cpu", "distributed.zero_stage=0 distributed.gpu_collectives=staged",
        "distributed.zero_stage=3 distributed.gpu_collectives=staged"}) {
    const RankSignalOutcome o =
        signal_rank_mid_training({mpirun, ENGINE_BINARY, ENGINE_SOURCE_DIR "/recipes/quickstart.yaml",
                                  std::string("run.device=cuda ") + stage, kTimeout},
                                 1, SIGSTOP);
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << stage << "\n" << o.output;
    EXPECT_LT(o.seconds_after_signal, 1.1 * kTimeout + kTeardownSlack) << stage << "\n" << o.output;
    EXPECT_NE(o.output.find("device: cuda"), std::string::npos) << stage << "\n" << o.output;
    EXPECT_NE(o.output.find("did not complete within 3 s; rank 1 did not reach it"), std::string::npos) << stage << "\n"
                                                                                                        << o.output;
  }
}

// engine plan's device memory against the allocator's high-water mark, for every ZeRO and offload
// setting `engine plan --fit` chooses among: within 5% (the staging mirrors are page-locked host
// memory, not counted there). Stage 0's: CudaTraining.MeasuredDeviceMemory...
// And `engine plan --fit --device-memory auto` reads the GPU's free memory.
TEST(CudaZero, DeviceMemoryOfEveryZeroSettingIsThePlanWithinFivePercent) {
  REQUIRE_CUDA_DEVICE();
  const TempDir dir("cuda_zero_memory");
  const std::string nvme = "offload.nvme_path=" + (dir.path() / "swap").string();
  for (const std::string& setting : std::vector<std::string>{
           "distributed.zero_stage=1 offload.optimizer=cpu", "distributed.zero_stage=2", "distributed.zero_stage=3",
           "distributed.zero_stage=3 offload.optimizer=cpu offload.parameters=cpu",
           "distributed.zero_stage=3 offload.optimizer=nvme offload.parameters=nvme " + nvme}) {
    std::vector<std::string> overrides = {"precision.mode=bf16",
                                          "model.n_embd=256",
                                          "model.n_layer=4",
                                          "train.micro_batch_size=32",
                                          "train.gradient_accumulation_steps=2",
                                          "run.device=cuda",
                                          "train.eval_every=0"};
    std::istringstream words(setting);
    for (std::string word; words >> word;) overrides.push_back(word);
    const recipe::Recipe r = quickstart(overrides).recipe;
    const DeviceMemoryPlan plan = plan_device_memory(compile_step(r), r);
    Session session(r);
    session.store.initialize(1);
    for (int64_t step = 0; step < 2; ++step)
      session.train_step(step, [&, micro = int64_t(0)]() mutable {
        Batch batch(session.micro_batch, session.model.sequence, session.data->features());
        session.data->fill(Split::train, 2 * step + micro++, batch);
        return batch;
      });
    ASSERT_EQ(session.device_optimizer == nullptr, !device_resident(r)) << setting;
    const DeviceMemory measured = session.executor.runner()->memory();
    const double ratio = double(measured.device_peak) / double(plan.total());
    std::printf("%s: planned %lld bytes, measured peak %lld (%.4f), pinned %lld\n", setting.c_str(),
                (long long)plan.total(), (long long)measured.device_peak, ratio, (long long)measured.pinned);
    EXPECT_NEAR(ratio, 1.0, 0.05) << setting;
    // The host's page-locked staging is the plan's (MemoryPlan::pinned), but for the step's scalars
    // and the kept losses' slots.
    EXPECT_LE(measured.pinned, compile_step(r).memory.pinned + (int64_t(1) << 20)) << setting;
  }
  const ShellResult fit = run_shell("'" ENGINE_BINARY
                                    "' plan recipes/quickstart.yaml run.device=cuda --fit "
                                    "--device-memory auto --nvme 1TiB",
                                    ENGINE_SOURCE_DIR);
  EXPECT_EQ(fit.status, 0) << fit.output;
  EXPECT_NE(fit.output.find("(cudaMemGetInfo)"), std::string::npos) << fit.output;
  EXPECT_NE(fit.output.find("fastest that fits:"), std::string::npos) << fit.output;
}

}  // namespace
}  // namespace engine::testing
