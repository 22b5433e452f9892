// Training on a CUDA device against the same run on the CPU: the same recipe, seed and batches,
// step for step. fp32 runs compute every product in pure fp32 (no TF32), so their losses agree to
// 1e-4 relative; 16-bit runs round differently on each device (other summation orders before each
// rounding), within the stated band. Skipped, saying so, where no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../equivalence/run_util.h"
#include "../temp_dir.h"
#include "core/device_info.h"
#include "require_cuda_device.h"
#include "trainer/device.h"

namespace engine::testing {
namespace {

struct Compared {
  double worst_loss = 0;    // largest per-step relative loss difference
  double worst_weight = 0;  // largest relative difference of any parameter tensor at the end
};

Compared compare(std::vector<std::string> overrides, int64_t steps) {
  overrides.push_back("run.device=cpu");
  const Run cpu = run(quickstart(overrides).recipe, steps);
  overrides.back() = "run.device=cuda";
  const Run gpu = run(quickstart(overrides).recipe, steps);
  Compared c;
  for (int64_t s = 0; s < steps; ++s) {
    const double rel = std::abs(gpu.losses[size_t(s)] - cpu.losses[size_t(s)]) / std::abs(cpu.losses[size_t(s)]);
    c.worst_loss = std::max(c.worst_loss, rel);
    std::printf("step %2lld  cpu %.8f  cuda %.8f  rel %.2e\n", (long long)s, cpu.losses[size_t(s)],
                gpu.losses[size_t(s)], rel);
  }
  for (size_t i = 0; i < cpu.weights.size(); ++i)
    c.worst_weight = std::max(c.worst_weight, relative_error(gpu.weights[i], cpu.weights[i]));
  std::printf("worst loss rel %.3e, worst weight rel %.3e\n", c.worst_loss, c.worst_weight);
  return c;
}

const std::vector<std::string> kShort = {"train.steps=20", "train.eval_every=0", "scheduler.warmup_steps=5"};

std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> all = kShort;
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

TEST(CudaTraining, GptFp32TracksTheCpuRun) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({}), 20);
  EXPECT_LT(c.worst_loss, 1e-4);
}

TEST(CudaTraining, GptFp32WithDropoutAndAccumulationTracksTheCpuRun) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"model.dropout=0.1", "train.gradient_accumulation_steps=2"}), 20);
  EXPECT_LT(c.worst_loss, 1e-4);
}

// The step replayed as CUDA graphs (the plan of each micro-batch, the micro-batches' sum, the
// gradients' finish, the update) gives the eager replay's bits, losses and weights, where the
// kernels read per-step values from device memory: dropout's seed and counters (two micro-batches a
// step, each its own stream) and fp16's loss scale (which the scaler changes between steps: grown
// every 3 clean steps, halved at an overflow).
// At ZeRO-3 the plan's gathers and sums run between graphs of the kernels around them (one graph
// per segment between two positions with actions), with the same bits.
TEST(CudaTraining, GraphReplayEqualsEagerBitForBit) {
  REQUIRE_CUDA_DEVICE();
  for (const std::string precision : {"fp32", "fp16", "bf16 distributed.zero_stage=3"}) {
    const bool segmented = precision.find("zero_stage=3") != std::string::npos;
    std::vector<std::string> overrides = with({"model.dropout=0.1", "train.gradient_accumulation_steps=2",
                                               "precision.mode=" + precision.substr(0, 4), "run.device=cuda"});
    if (segmented) overrides.push_back("distributed.zero_stage=3");
    if (precision == "fp16") overrides.push_back("precision.growth_interval=3");
    overrides.push_back("run.cuda_graphs=false");
    const int64_t steps = 8;
    const testing::Run eager = run(quickstart(overrides).recipe, steps);
    overrides.back() = "run.cuda_graphs=true";
    const testing::Run graphs = run(quickstart(overrides).recipe, steps);
    EXPECT_EQ(eager.graph_replays, 0) << precision;
    if (segmented) {  // every micro-batch's segments but the first micro-batch's (eager)
      EXPECT_GT(graphs.graph_replays, 2 * steps - 1) << precision;
      EXPECT_EQ(graphs.graph_replays % (2 * steps - 1), 0) << precision;
    } else {
      EXPECT_EQ(graphs.graph_replays, 2 * steps - 1) << precision << ": every micro-batch but the first (eager)";
    }
    // The optimizer's phases: each micro-batch's sum, the gradients' finish with the decision and
    // the update (skipped steps run it too, and their kernels read the decision and do nothing).
    EXPECT_EQ(eager.update_graph_replays, 0);
    // (ZeRO-3's plan sums the micro-batches itself: two phases a step, each first run at step 1,
    // since step 0's hook takes the host's path.)
    EXPECT_GE(graphs.update_graph_replays, segmented ? 2 * (steps - 2) : 3 * (steps - 1) - 1) << precision;
    for (int64_t s = 0; s < steps; ++s) {
      EXPECT_EQ(graphs.losses[size_t(s)], eager.losses[size_t(s)]) << precision << " step " << s;
      EXPECT_EQ(graphs.loss_scales[size_t(s)], eager.loss_scales[size_t(s)]) << precision << " step " << s;
    }
    ASSERT_EQ(graphs.weights.size(), eager.weights.size());
    for (size_t i = 0; i < eager.weights.size(); ++i)
      EXPECT_EQ(graphs.weights[i], eager.weights[i]) << precision << " parameter " << i;
  }
}

// `steps` steps of two micro-batches each, batches 2 s and 2 s + 1 of the training split.
void train_steps_of_two(Session& session, int64_t steps) {
  for (int64_t step = 0; step < steps; ++step)
    session.train_step(step, [&, micro = int64_t(0)]() mutable {
      Batch batch(session.micro_batch, session.model.sequence, session.data->features());
      session.data->fill(Split::train, 2 * step + micro++, batch);
      return batch;
    });
}

// Each batch starts for the device when the trainer loads it (DeviceRunner::stage_inputs, on a
// copy stream of its own), so the copy of a step's first batch overlaps the previous step's update,
// which the host does not wait for: no run has to enqueue its own inputs. The runs' results are
// those of the CPU (the tests above), so no copy overtook the kernels still reading the last inputs.
TEST(CudaTraining, EveryBatchIsStagedAheadOfItsRun) {
  REQUIRE_CUDA_DEVICE();
  const recipe::Recipe r = quickstart(with({"train.gradient_accumulation_steps=2", "run.device=cuda"})).recipe;
  Session session(r);
  session.store.initialize(1);
  const int64_t steps = 4;
  train_steps_of_two(session, steps);
  const DeviceTimes times = session.executor.device_times();
  EXPECT_EQ(times.runs, 2 * steps);
  EXPECT_EQ(times.staged_ahead, times.runs);
}

// A staged run (ZeRO-Offload) uploads the parameters once a step, after the host's update, not
// for each micro-batch: 4 steps of 2 micro-batches, 4 uploads. Its bits are the resident run's
// (CudaZero.EveryStageAndOffloadOnOneProcessGivesTheResidentRunsBits), so no run read stale ones.
TEST(CudaTraining, AStagedRunUploadsTheParametersOnceAStep) {
  REQUIRE_CUDA_DEVICE();
  const recipe::Recipe r =
      quickstart(with({"train.gradient_accumulation_steps=2", "run.device=cuda", "offload.optimizer=cpu"})).recipe;
  Session session(r);
  session.store.initialize(1);
  ASSERT_EQ(session.device_optimizer, nullptr) << "a staged run";
  const int64_t steps = 4;
  train_steps_of_two(session, steps);
  const DeviceTimes times = session.executor.device_times();
  EXPECT_EQ(times.runs, 2 * steps);
  EXPECT_EQ(times.parameter_uploads, steps);
}

// A resident step reads nothing back before its end: the micro-batches' losses stay on the
// device, the update is decided there (update_math.h decide_update), and the host waits once a
// step, for the losses and the decision, while the update runs (Session::finish_step_on_device).
// fp16 too: its overflow skips are decided on the device. The runs' results are the CPU's (the
// tests above), so nothing was read before the device wrote it.
TEST(CudaTraining, TheHostWaitsForTheDeviceOnceAStep) {
  REQUIRE_CUDA_DEVICE();
  for (const char* precision : {"bf16", "fp16"}) {
    const recipe::Recipe r = quickstart(with({"train.gradient_accumulation_steps=2", "run.device=cuda",
                                              std::string("precision.mode=") + precision}))
                                 .recipe;
    Session session(r);
    session.store.initialize(1);
    int64_t waits_after_first = 0;
    const int64_t steps = 5;
    for (int64_t step = 0; step < steps; ++step) {
      session.train_step(step, [&, micro = int64_t(0)]() mutable {
        Batch batch(session.micro_batch, session.model.sequence, session.data->features());
        session.data->fill(Split::train, 2 * step + micro++, batch);
        return batch;
      });
      if (step == 0) waits_after_first = session.executor.device_times().waits;  // the first includes the upload
    }
    EXPECT_EQ(session.executor.device_times().waits - waits_after_first, steps - 1) << precision;
  }
}

// engine plan's device memory against what a GPU run allocates (the allocator's high-water mark),
// on a model whose activations outweigh the fixed workspace: within 5%.
TEST(CudaTraining, MeasuredDeviceMemoryIsThePlanWithinFivePercent) {
  REQUIRE_CUDA_DEVICE();
  for (const char* mode : {"fp32", "bf16"}) {
    const recipe::Recipe r =
        quickstart(with({std::string("precision.mode=") + mode, "model.n_embd=256", "model.n_layer=4",
                         "train.micro_batch_size=32", "train.gradient_accumulation_steps=2", "run.device=cuda"}))
            .recipe;
    const DeviceMemoryPlan plan = plan_device_memory(compile_step(r), r);
    Session session(r);
    session.store.initialize(1);
    for (int64_t step = 0; step < 2; ++step)
      session.train_step(step, [&] {
        Batch batch(session.micro_batch, session.model.sequence, session.data->features());
        session.data->fill(Split::train, step, batch);
        return batch;
      });
    const DeviceMemory measured = session.executor.runner()->memory();
    const double ratio = double(measured.device_peak) / double(plan.total());
    std::printf("%s: planned %lld bytes, measured peak %lld (%.4f)\n", mode, (long long)plan.total(),
                (long long)measured.device_peak, ratio);
    EXPECT_GT(plan.activations, plan.workspace) << mode << ": a model whose activations matter";
    EXPECT_NEAR(ratio, 1.0, 0.05) << mode;
  }
}

TEST(CudaTraining, LlamaFp32TracksTheCpuRun) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"model.arch=llama", "model.kv_heads=2"}), 20);
  EXPECT_LT(c.worst_loss, 1e-4);
}

TEST(CudaTraining, GptFullRecomputeWithHostCheckpointsTracksTheCpuRun) {
  REQUIRE_CUDA_DEVICE();
  const Compared c =
      compare(with({"activation_checkpointing.policy=full", "activation_checkpointing.cpu_checkpointing=true"}), 20);
  EXPECT_LT(c.worst_loss, 1e-4);
}

// bf16 rounds every activation to 8 bits of mantissa (2^-8 = 0.4%); a 20-step loss curve of this
// model moves by a few of those between two correct bf16 implementations. The band: 2%.
TEST(CudaTraining, GptBf16StaysWithinItsBand) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"precision.mode=bf16"}), 20);
  EXPECT_LT(c.worst_loss, 2e-2);
}

TEST(CudaTraining, LlamaBf16StaysWithinItsBand) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"model.arch=llama", "model.kv_heads=2", "precision.mode=bf16"}), 20);
  EXPECT_LT(c.worst_loss, 2e-2);
}

TEST(CudaTraining, EvaluationMatchesTheCpu) {
  REQUIRE_CUDA_DEVICE();
  double loss[2];
  for (int device = 0; device < 2; ++device) {
    Session session(quickstart(with({device ? "run.device=cuda" : "run.device=cpu"})).recipe);
    session.store.initialize(1337);
    loss[device] = session.evaluate(2);
  }
  EXPECT_LT(std::abs(loss[1] - loss[0]) / loss[0], 1e-5) << loss[0] << " vs " << loss[1];
}

// The step's sum kept in bf16 (precision.accumulation_dtype): the norm and the update read it in
// bf16, widened in registers.
TEST(CudaTraining, Bf16SummedInBf16StaysWithinItsBand) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(
      with({"precision.mode=bf16", "precision.accumulation_dtype=bf16", "train.gradient_accumulation_steps=2"}), 20);
  EXPECT_LT(c.worst_loss, 2e-2);
}

// A step whose hook reads and writes back the gradients (a gradient dump, a plugin) decides on the
// host and updates from an fp32 copy of them; one without decides on the device and updates from
// the sums where they are. The same bits either way: the copy is exact, and the norm, the decision
// and the element math are the same functions. Hooks on every other step (even ones in one run,
// odd ones in another), so the paths alternate;
// in fp16 from a loss scale that overflows the first steps (on the CPU: steps 0-2), so a hooked
// step skips its update and the unhooked step after it, which updates, must read its own sums, not
// the copy the skipped step never read.
TEST(CudaTraining, StepsWithAndWithoutGradientHooksUpdateAlike) {
  REQUIRE_CUDA_DEVICE();
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"bf16 summed in fp32", {"precision.mode=bf16", "precision.accumulation_dtype=fp32"}},
      {"bf16 summed in bf16", {"precision.mode=bf16", "precision.accumulation_dtype=bf16"}},
      {"fp16 overflowing", {"precision.mode=fp16", "precision.initial_scale_power=28", "precision.hysteresis=1"}}};
  for (const auto& [name, precision] : cases) {
    std::vector<std::string> overrides = precision;
    overrides.insert(overrides.end(), {"train.gradient_accumulation_steps=2", "run.device=cuda"});
    const recipe::Recipe r = quickstart(with(overrides)).recipe;
    // Run 0 without hooks, run 1 with them on even steps, run 2 on odd ones: whichever step
    // overflows last, one of the hooked runs skips it with its hook and updates at the next.
    std::vector<double> losses[3], norms[3];
    std::vector<bool> skipped[3];
    std::vector<std::vector<float>> weights[3];
    const auto hooked_at = [](int run, int64_t step) { return run > 0 && step % 2 == run - 1; };
    for (int hooked = 0; hooked < 3; ++hooked) {
      Session session(r);
      session.store.initialize(1);
      for (int64_t step = 0; step < 16; ++step) {
        Session::StepHooks hooks;
        if (hooked_at(hooked, step)) hooks.after_backward = [] {};
        const Session::StepResult result = session.train_step(
            step,
            [&, micro = int64_t(0)]() mutable {
              Batch batch(session.micro_batch, session.model.sequence, session.data->features());
              session.data->fill(Split::train, 2 * step + micro++, batch);
              return batch;
            },
            hooks);
        losses[hooked].push_back(result.loss);
        norms[hooked].push_back(result.grad_norm);
        skipped[hooked].push_back(result.skipped);
      }
      session.sync_host();
      for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
        const float* w = session.store.param(int(i));
        weights[hooked].emplace_back(w, w + session.store.numel(int(i)));
      }
    }
    for (int hooked = 1; hooked < 3; ++hooked) {
      EXPECT_EQ(losses[0], losses[hooked]) << name << " run " << hooked;
      EXPECT_EQ(skipped[0], skipped[hooked]) << name << " run " << hooked;
      for (size_t step = 0; step < norms[0].size(); ++step)  // an overflowed step's norm may be NaN on both
        if (std::isfinite(norms[0][step]) || std::isfinite(norms[hooked][step])) {
          EXPECT_EQ(norms[0][step], norms[hooked][step]) << name << " run " << hooked << " step " << step;
        }
      EXPECT_EQ(weights[0], weights[hooked]) << name << " run " << hooked;
    }
    if (std::string(name) == "fp16 overflowing") {  // a hooked step skipped, and the next one updated
      bool hooked_skip_then_update = false;
      for (int hooked = 1; hooked < 3; ++hooked)
        for (size_t step = 0; step + 1 < skipped[hooked].size(); ++step)
          if (hooked_at(hooked, int64_t(step)) && skipped[hooked][step] && !skipped[hooked][step + 1])
            hooked_skip_then_update = true;
      EXPECT_TRUE(hooked_skip_then_update) << name << ": raise initial_scale_power until the first steps overflow";
      EXPECT_FALSE(skipped[0].back()) << name << ": lower initial_scale_power until the last steps update";
    }
  }
}

TEST(CudaTraining, Bf16WithAccumulationStaysWithinItsBand) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"precision.mode=bf16", "train.gradient_accumulation_steps=2"}), 20);
  EXPECT_LT(c.worst_loss, 2e-2);
}

TEST(CudaTraining, Fp16WithLossScalingStaysWithinItsBand) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"precision.mode=fp16"}), 20);
  EXPECT_LT(c.worst_loss, 2e-2);
}

TEST(CudaTraining, SgdWithMomentumTracksTheCpuRun) {
  REQUIRE_CUDA_DEVICE();
  const Compared c = compare(with({"optimizer.type=sgd", "optimizer.lr=0.05", "optimizer.momentum=0.9"}), 20);
  EXPECT_LT(c.worst_loss, 1e-4);
}

// The final loss and step count of `engine train` on the quick start with `arguments`.
double train_final_loss(const std::filesystem::path& dir, const std::string& arguments) {
  const std::string command = "OMP_NUM_THREADS=4 '" ENGINE_BINARY "' train '" ENGINE_SOURCE_DIR
                              "/recipes/quickstart.yaml' train.steps=8 train.eval_every=0 checkpoint.every_steps=4 "
                              "run.output_dir='" +
                              dir.string() + "' " + arguments + " > '" + dir.string() + "/log.txt' 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream summary(dir / "quickstart" / "summary.json");
  return nlohmann::json::parse(summary).at("final_loss").get<double>();
}

// A checkpoint is the host's record of the model, whichever device trained it: a run cut at step 4
// on one device and resumed on the other ends where a straight run on the first does (fp32: the
// devices agree to 1e-4, as above).
TEST(CudaTraining, CheckpointsResumeAcrossDevices) {
  REQUIRE_CUDA_DEVICE();
  for (const auto& [first, second] : {std::pair{"cuda", "cpu"}, std::pair{"cpu", "cuda"}}) {
    const TempDir straight("straight"), cut("cut");
    const double expected = train_final_loss(straight.path(), std::string("run.device=") + first);
    train_final_loss(cut.path(), std::string("run.device=") + first + " --stop-after 4");
    const double resumed = train_final_loss(cut.path(), std::string("run.device=") + second + " --resume");
    EXPECT_LT(std::abs(resumed - expected) / expected, 1e-4)
        << first << " then " << second << ": " << resumed << " vs " << expected;
  }
}

}  // namespace
}  // namespace engine::testing
