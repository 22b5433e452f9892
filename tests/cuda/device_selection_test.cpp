// run.device resolved against the build and the machine (trainer/device.h), on any machine: the
// answers differ where a GPU is present, and each test says which it checks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "../equivalence/run_util.h"
#include "core/device_info.h"
#include "dist/zero_plan.h"
#include "elementwise/add.h"
#include "graph/autodiff.h"
#include "linalg/linear.h"
#include "linalg/linear_gelu.h"
#include "nn/activation.h"
#include "nn/add_norm.h"
#include "nn/attention.h"
#include "nn/attention_cudnn.h"
#include "nn/layernorm.h"
#include "recipe/diagnostic.h"
#include "trainer/device.h"

namespace engine::testing {
namespace {

TEST(DeviceSelection, CpuIsAlwaysTheCpu) {
  EXPECT_EQ(resolve_device(quickstart({"run.device=cpu"}).recipe, 1).kind, Device::Kind::cpu);
}

TEST(DeviceSelection, AutoIsTheGpuOnlyWhereOneIsPresent) {
  const Device d = resolve_device(quickstart({}).recipe, 1);
  EXPECT_EQ(d.kind, cuda_device_count() > 0 ? Device::Kind::cuda : Device::Kind::cpu);
}

// Each rank of a machine takes its own GPU, round robin where there are more ranks than GPUs.
TEST(DeviceSelection, AutoTakesTheLocalRanksGpu) {
  const int devices = cuda_device_count();
  const Device d = resolve_device(quickstart({}).recipe, 3);
  if (devices == 0) GTEST_SKIP() << "no CUDA device here: auto is the CPU at every rank";
  EXPECT_EQ(d.kind, Device::Kind::cuda);
  EXPECT_EQ(d.index, 3 % devices);
}

TEST(DeviceSelection, CudaWithoutADeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: run.device cuda is valid here";
  try {
    resolve_device(quickstart({"run.device=cuda"}).recipe, 1);
    FAIL() << "resolved";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("run.device: cuda"), std::string::npos) << e.what();
  }
  // A session is refused before it allocates anything.
  EXPECT_THROW(Session(quickstart({"run.device=cuda"}).recipe), UserError);
}

// Every ZeRO stage and offload tier is a valid GPU recipe. Every stage stays resident (at any world
// size), reducing (and gathering) through a device communicator; offload is staged through the
// host, and says which tier makes it so.
TEST(DeviceSelection, OffloadRunsAreStagedThroughTheHost) {
  std::string why;
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_TRUE(device_resident(
        quickstart({"run.device=cuda", "distributed.zero_stage=" + std::to_string(stage)}).recipe, &why))
        << "stage " << stage;
    EXPECT_EQ(why, "");
  }
  EXPECT_FALSE(device_resident(quickstart({"run.device=cuda", "offload.optimizer=cpu"}).recipe, &why));
  EXPECT_EQ(why, "offload.optimizer");
  const recipe::Recipe offload =
      quickstart({"run.device=cuda", "distributed.zero_stage=3", "offload.optimizer=cpu", "offload.parameters=cpu"})
          .recipe;
  EXPECT_FALSE(device_resident(offload, &why));
  EXPECT_EQ(why, "offload.optimizer");
  EXPECT_FALSE(device_resident(
      quickstart({"run.device=cuda", "distributed.zero_stage=3", "offload.parameters=cpu"}).recipe, &why));
  EXPECT_EQ(why, "offload.parameters");
}

// Which resident runs reduce through a device communicator: several ranks, or one that names a
// path (distributed.gpu_collectives); never a staged run, whose host reduces.
TEST(DeviceSelection, SeveralRanksOrANamedPathReduceOnTheDevice) {
  EXPECT_FALSE(uses_device_collectives(quickstart({"run.device=cuda"}).recipe, 1));
  EXPECT_TRUE(uses_device_collectives(quickstart({"run.device=cuda"}).recipe, 2));
  EXPECT_TRUE(uses_device_collectives(quickstart({"run.device=cuda", "distributed.gpu_collectives=staged"}).recipe, 1));
  EXPECT_TRUE(uses_device_collectives(quickstart({"run.device=cuda", "distributed.gpu_collectives=nccl"}).recipe, 1));
  EXPECT_TRUE(uses_device_collectives(quickstart({"run.device=cuda", "distributed.zero_stage=3"}).recipe, 2));
  EXPECT_FALSE(uses_device_collectives(quickstart({"run.device=cuda", "distributed.zero_stage=3"}).recipe, 1));
  EXPECT_FALSE(uses_device_collectives(quickstart({"run.device=cuda", "offload.optimizer=cpu"}).recipe, 2));
  // On the CPU there is no device communicator, whatever the recipe names.
  auto local = make_local_communicator();
  EXPECT_EQ(make_device_collectives(quickstart({"distributed.gpu_collectives=staged"}).recipe, *local, Device{}),
            nullptr);
}

// nccl where ranks share a GPU (the same machine and PCI bus id, gathered from every rank) is refused
// before NCCL is asked (it would refuse them itself); auto stages through the host for them.
TEST(DeviceSelection, NcclForRanksSharingAGpuIsAClearError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here: there is no GPU to share";
  auto local = make_local_communicator();
  // Two ranks on one machine whose gathers see this rank's bytes twice: the same host and GPU.
  class TwoRanksOnOneGpu final : public Communicator {
   public:
    explicit TwoRanksOnOneGpu(Communicator& c) : c_(c) {}
    int rank() const override { return 0; }
    int size() const override { return 2; }
    int local_rank() const override { return 0; }
    int local_size() const override { return 2; }
    std::string backend() const override { return "two"; }
    Work reduce_scatter(const void* s, void* r, int64_t n, DType t, Reduction d, std::string w, Stream) override {
      return c_.reduce_scatter(s, r, n, t, d, std::move(w));
    }
    Work all_gather(const void* s, void* r, int64_t b, std::string, Stream) override {
      for (int k = 0; k < 2; ++k) std::memcpy(static_cast<char*>(r) + k * b, s, size_t(b));
      return Work();
    }
    Work all_reduce(void* d, int64_t n, DType t, std::string w, Stream) override {
      return c_.all_reduce(d, n, t, std::move(w));
    }
    Work broadcast(void* d, int64_t b, int root, std::string w, Stream) override {
      return c_.broadcast(d, b, root, std::move(w));
    }
    Work barrier(std::string w) override { return c_.barrier(std::move(w)); }
    int64_t bytes_sent() const override { return 0; }
    [[noreturn]] void abort_job(int code) override {
      c_.abort_job(code);
      std::abort();  // not reached: the wrapped communicator's abort_job does not return either
    }

   private:
    Communicator& c_;
  } sharing(*local);
  try {
    make_device_collectives(quickstart({"run.device=cuda", "distributed.gpu_collectives=nccl"}).recipe, sharing,
                            Device{Device::Kind::cuda, 0});
    FAIL() << "made an NCCL communicator for ranks sharing a GPU";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 share GPU "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NCCL refuses two ranks on one GPU"), std::string::npos) << e.what();
  }
  std::string how;
  EXPECT_NE(
      make_device_collectives(quickstart({"run.device=cuda"}).recipe, sharing, Device{Device::Kind::cuda, 0}, &how),
      nullptr);
  EXPECT_NE(how.find("page-locked host memory"), std::string::npos) << how;
}

TEST(DeviceSelection, NamesTheDevice) {
  EXPECT_EQ(describe_device(Device{}), "cpu");
  EXPECT_EQ(describe_device(Device{Device::Kind::cuda, 0}).rfind("cuda:0 (", 0), 0u);
}

// engine plan's device memory: what the runner and the device optimizer allocate, by the store's
// padded layout (1024-element blocks per unit), in each precision.
TEST(DeviceSelection, DeviceMemoryPlanCountsWhatAGpuRunAllocates) {
  for (const char* mode : {"fp32", "bf16", "bf16 summed in bf16"}) {
    std::vector<std::string> overrides{std::string("precision.mode=") + (mode[0] == 'f' ? "fp32" : "bf16"),
                                       "train.gradient_accumulation_steps=2"};
    if (std::string(mode).find("summed") != std::string::npos) overrides.push_back("precision.accumulation_dtype=bf16");
    const recipe::Recipe r = quickstart(overrides).recipe;
    const CompiledStep step = compile_step(r);
    const DeviceMemoryPlan d = plan_device_memory(step, r);
    int64_t padded = 0;
    for (const Unit& unit : step.model.graph.units()) padded += (unit.numel + 1023) / 1024 * 1024;
    const bool sixteen = mode[0] == 'b';
    EXPECT_EQ(d.parameters, padded * (sixteen ? 2 : 4)) << mode;
    EXPECT_EQ(d.masters, sixteen ? padded * 4 : 0) << mode;
    EXPECT_EQ(d.optimizer_state, 2 * padded * 4) << mode;  // AdamW's two moments
    EXPECT_EQ(d.activations, std::max(step.train.arena_bytes, step.eval.arena_bytes)) << mode;
    // Accumulation 2: the step's sum, in the gradient type (the update reads it there), and the
    // norm's partial sums per 1024 elements with their sums per 256.
    const auto grad = int64_t(dtype_size(step.model.graph.grad_dtype()));  // bf16 runs sum in fp32 by default
    EXPECT_EQ(grad, std::string(mode).find("summed") != std::string::npos ? 2 : 4) << mode;
    EXPECT_EQ(d.gradient_sum, padded * grad + (padded / 1024 + (padded / 1024 + 255) / 256) * 8) << mode;
    EXPECT_EQ(d.total(), d.activations + d.casts + d.inputs + d.parameters + d.gradients + d.masters +
                             d.optimizer_state + d.gradient_sum + d.reduce_staging + d.workspace);
  }
}

// Two ranks at stage 0 hold what one does, padded for two ranks, plus the sum their reductions land
// in (whatever the accumulation) and NCCL's staging for the largest unit's chunks.
TEST(DeviceSelection, ReducingRanksPlanTheirSumAndReduceStaging) {
  const recipe::Recipe r = quickstart({"precision.mode=bf16", "run.device=cuda"}).recipe;
  const CompiledStep step = compile_step(r, 2);
  const DeviceMemoryPlan d = plan_device_memory(step, r, 2);
  int64_t padded = 0, largest = 0, value_blocks = 0;  // the norm's partial sums skip the padding
  for (const Unit& unit : step.model.graph.units()) {
    const int64_t p = (unit.numel + 2047) / 2048 * 2048;
    padded += p;
    largest = std::max(largest, p);
    value_blocks += (unit.numel + 1023) / 1024;
  }
  EXPECT_EQ(d.parameters, padded * 2);
  EXPECT_EQ(d.gradients, padded * 4);  // bf16 runs' gradients are fp32 by default
  EXPECT_EQ(d.gradient_sum, padded * 4 + (value_blocks + (value_blocks + 255) / 256) * 8);
  EXPECT_EQ(d.reduce_staging, largest * 4);
  const DeviceMemoryPlan one = plan_device_memory(compile_step(r), r);
  EXPECT_EQ(one.reduce_staging, 0);
  EXPECT_LT(one.gradient_sum, padded) << "one process accumulating 1 sums nothing beyond the norm's partials";
}

// Two ranks at stage 1 hold the whole parameters and micro-batch gradients, and their shard of the
// masters, the optimizer state and the step's sum, with the norm's partial sums of the shard, of
// every rank (padding included) and of one process's list.
TEST(DeviceSelection, ShardedRanksPlanTheirShardOfTheState) {
  const recipe::Recipe r = quickstart({"precision.mode=bf16", "run.device=cuda", "distributed.zero_stage=1"}).recipe;
  const CompiledStep step = compile_step(r, 2);
  const DeviceMemoryPlan d = plan_device_memory(step, r, 2);
  int64_t padded = 0, value_blocks = 0;
  for (const Unit& unit : step.model.graph.units()) {
    padded += (unit.numel + 2047) / 2048 * 2048;
    value_blocks += (unit.numel + 1023) / 1024;
  }
  const int64_t shard = padded / 2;
  EXPECT_EQ(d.parameters, padded * 2);
  EXPECT_EQ(d.gradients, padded * 4);
  EXPECT_EQ(d.masters, shard * 4);
  EXPECT_EQ(d.optimizer_state, 2 * shard * 4);
  EXPECT_EQ(d.gradient_sum, shard * 4 + (value_blocks + (value_blocks + 255) / 256) * 8 + (shard + padded) / 1024 * 8);
  const DeviceMemoryPlan whole =
      plan_device_memory(compile_step(quickstart({"precision.mode=bf16", "run.device=cuda"}).recipe, 2),
                         quickstart({"precision.mode=bf16", "run.device=cuda"}).recipe, 2);
  EXPECT_LT(d.total(), whole.total()) << "stage 1 holds less than stage 0";
}

// Two ranks at stages 2-3 hold what stage 1 holds but the micro-batch gradients (the plan's arena
// buffers, which the backward writes and the reduce-scatters read); stage 3 holds its shard of the
// parameters too (in fp32, the masters themselves), gathering each unit into the arena. One process
// at stage 2 holds the whole sum, and stages no reduction.
TEST(DeviceSelection, ZeroTwoAndThreeRanksPlanTheirShardsAndTheArenasBuffers) {
  for (const char* precision : {"bf16", "fp32"}) {
    const bool sixteen = precision[0] == 'b';
    auto recipe_at = [&](int stage) {
      return quickstart({std::string("precision.mode=") + precision, "run.device=cuda",
                         "distributed.zero_stage=" + std::to_string(stage)})
          .recipe;
    };
    const recipe::Recipe r1 = recipe_at(1), r2 = recipe_at(2), r3 = recipe_at(3);
    const DeviceMemoryPlan one = plan_device_memory(compile_step(r1, 2), r1, 2);
    const CompiledStep step2 = compile_step(r2, 2), step3 = compile_step(r3, 2);
    const DeviceMemoryPlan two = plan_device_memory(step2, r2, 2), three = plan_device_memory(step3, r3, 2);
    int64_t padded = 0, largest = 0;
    for (const Unit& unit : step2.model.graph.units()) {
      padded += (unit.numel + 2047) / 2048 * 2048;
      largest = std::max(largest, (unit.numel + 2047) / 2048 * 2048);
    }
    const int64_t shard = padded / 2;
    EXPECT_EQ(two.parameters, one.parameters) << precision;
    EXPECT_EQ(two.gradients, 0) << precision;
    EXPECT_EQ(two.masters, one.masters) << precision;
    EXPECT_EQ(two.optimizer_state, one.optimizer_state) << precision;
    EXPECT_EQ(two.gradient_sum, one.gradient_sum) << precision;
    EXPECT_EQ(two.reduce_staging, largest * 4) << precision;
    EXPECT_EQ(two.activations, std::max(step2.train.arena_bytes, step2.eval.arena_bytes)) << precision;
    EXPECT_EQ(three.parameters, sixteen ? shard * 2 : 0) << precision;
    EXPECT_EQ(three.masters, shard * 4) << precision;
    EXPECT_EQ(three.gradients + three.optimizer_state + three.gradient_sum,
              two.gradients + two.optimizer_state + two.gradient_sum)
        << precision;
    EXPECT_LT(two.total() - two.activations, one.total() - one.activations) << precision;
    EXPECT_LT(three.total() - three.activations, two.total() - two.activations) << precision;
    const DeviceMemoryPlan alone = plan_device_memory(compile_step(r2), r2);
    int64_t whole = 0;
    for (const Unit& unit : step2.model.graph.units()) whole += (unit.numel + 1023) / 1024 * 1024;
    EXPECT_EQ(alone.gradients, 0) << precision;
    EXPECT_EQ(alone.reduce_staging, 0) << precision;
    EXPECT_GE(alone.gradient_sum, whole * 4) << precision << ": the step's whole sum";
  }
}

// A resident ZeRO-2/3 run reduce-scatters each unit's gradients where the plan says its backward
// has written them: the plan reads that from the nodes' outputs, so every fused node must list each
// gradient it writes. The fused GPU graphs of GPT and Llama write the same gradients as the unfused
// ones, and no node writes a unit's gradients after its reduce.
TEST(DeviceSelection, FusedPlansReduceEachUnitAfterEveryWriteOfItsGradients) {
  for (const char* arch : {"gpt", "llama"}) {
    auto compiled = [&](const char* fusions) {
      return compile_step(quickstart({std::string("model.arch=") + arch, "precision.mode=bf16", "run.device=cuda",
                                      "distributed.zero_stage=2", std::string("run.fusions=") + fusions})
                              .recipe,
                          2);
    };
    const CompiledStep fused = compiled("true"), unfused = compiled("false");
    ASSERT_GT(fused.fusions.total(), 0) << arch;
    auto written = [](const CompiledStep& step) {
      std::set<std::string> names;
      for (const Node& node : step.model.graph.nodes())
        for (ValueId v : node.outputs)
          if (step.model.graph.value(v).placement == Placement::gradient) names.insert(step.model.graph.value(v).name);
      return names;
    };
    EXPECT_EQ(written(fused), written(unfused)) << arch;
    EXPECT_EQ(written(fused).size(), fused.model.graph.params().size()) << arch << ": every parameter's gradient";
    const Graph& g = fused.model.graph;
    const Plan& plan = fused.train;
    ASSERT_EQ(plan.actions.size(), plan.nodes.size() + 1) << arch;
    std::vector<int> reduced_at(g.units().size(), -1);
    for (size_t p = 0; p < plan.actions.size(); ++p)
      for (const StepAction& a : plan.actions[p])
        if (a.kind == StepAction::Kind::reduce) reduced_at[size_t(a.unit)] = int(p);
    for (size_t p = 0; p < plan.nodes.size(); ++p)
      for (ValueId v : g.nodes()[plan.nodes[p]].outputs)
        if (g.value(v).placement == Placement::gradient) {
          const int unit = g.params()[size_t(g.value(v).param)].unit;
          EXPECT_GT(reduced_at[size_t(unit)], int(p)) << arch << ": " << g.value(v).name;
        }
  }
}

// A GPU run's host memory (MemoryPlan::total(), what engine train and engine plan --fit check)
// leaves out the activation arena and the f32 scratch, which are the device's, and holds
// page-locked staging instead: the inputs' two slots, and for a run staged through the host
// (offload) the mirrors of ZeRO's buffers, at least the largest and at most one block for each of
// the plan's buffers. A CPU plan holds the arena and the scratch itself.
TEST(DeviceSelection, AGpuRunsHostPlanLeavesTheActivationsToTheDevice) {
  for (const char* stage : {"distributed.zero_stage=2", "distributed.zero_stage=3"})
    for (const char* setting : {"offload.optimizer=none", "offload.optimizer=cpu"}) {
      for (const char* device : {"cuda", "cpu"}) {
        const std::string what = std::string(stage) + " " + setting + " " + device;
        const CompiledStep step = compile_step(
            quickstart({"precision.mode=bf16", stage, setting, std::string("run.device=") + device}).recipe);
        const MemoryPlan& m = step.memory;
        const bool gpu = std::string(device) == "cuda", staged = std::string(setting) == "offload.optimizer=cpu";
        const int64_t model_and_buffers =
            m.parameters + m.gradients + m.optimizer_state + m.inputs + m.host + m.staging + m.offload_buffers;
        const int64_t mirrors = staged_mirror_bytes(step.model.graph, {&step.train, &step.eval});
        EXPECT_EQ(m.total(), model_and_buffers +
                                 (gpu ? 2 * m.inputs + m.host + (staged ? mirrors : 0) : m.activations + m.scratch))
            << what;
        EXPECT_EQ(m.on_device, gpu ? m.activations + m.scratch : 0) << what;
        int64_t largest = 0, every = 0;
        std::set<ValueId> buffers;
        for (const Plan* plan : {&step.train, &step.eval})
          for (const auto& list : plan->actions)
            for (const StepAction& a : list)
              if (a.buffer != kNoValue && buffers.insert(a.buffer).second) {
                const int64_t bytes = value_bytes(step.model.graph.value(a.buffer));
                largest = std::max(largest, bytes);
                every += bytes;
              }
        EXPECT_GT(largest, 0) << what << ": ZeRO's buffers";
        EXPECT_GE(mirrors, largest) << what;
        EXPECT_LE(mirrors, every) << what;
      }
    }
}

// run.deterministic: false lets every attention backward of a GPU plan that runs on cuDNN take its
// unordered sums (nn/attention.h); the default, fp32 (the engine's own kernels) and any CPU plan
// keep every one in a fixed order.
TEST(DeviceSelection, OnlyAGpuPlanWithDeterministicFalseSumsAttentionUnordered) {
  for (const char* arch : {"gpt", "llama"}) {
    auto marked = [&](const char* device, const char* deterministic, const char* precision = "bf16") {
      const CompiledStep step = compile_step(
          quickstart({std::string("model.arch=") + arch, std::string("precision.mode=") + precision,
                      std::string("run.device=") + device, std::string("run.deterministic=") + deterministic})
              .recipe);
      int backwards = 0, unordered = 0;
      for (const Node& node : step.model.graph.nodes())
        if (node.op == &ops::kCausalAttentionBackward) {
          ++backwards;
          unordered += ops::attention_sums_unordered(node);
        }
      EXPECT_EQ(step.fusions.unordered_attention, unordered) << arch << " " << device << " " << deterministic;
      return std::make_pair(backwards, unordered);
    };
    const auto [backwards, unordered] = marked("cuda", "false");
    EXPECT_EQ(backwards, 2) << arch << ": one per layer";
    EXPECT_EQ(unordered, cuda::kHaveCudnnAttention ? backwards : 0) << arch;
    EXPECT_EQ(marked("cuda", "true").second, 0) << arch;
    EXPECT_EQ(marked("cuda", "false", "fp32").second, 0) << arch << ": the engine's own kernels";
    EXPECT_EQ(marked("cpu", "false").second, 0) << arch;
  }
}

// A staged run (offload) downloads each unit's micro-batch gradients behind the last node that
// writes them (dist/zero_plan.h gradient_writes), on a stream of its own while the backward goes
// on: where the plan reduces the unit, and for most units well before the end of the backward.
TEST(DeviceSelection, AStagedRunDownloadsEachUnitWhereTheBackwardFinishesIt) {
  for (const char* arch : {"gpt", "llama"}) {
    const CompiledStep step =
        compile_step(quickstart({std::string("model.arch=") + arch, "precision.mode=bf16", "run.device=cuda",
                                 "model.n_layer=6", "offload.optimizer=cpu", "train.gradient_accumulation_steps=2"})
                         .recipe);
    const Graph& g = step.model.graph;
    const Plan& plan = step.train;
    const std::vector<GradientWrites> writes = gradient_writes(g, plan.nodes);
    ASSERT_EQ(writes.size(), g.units().size()) << arch;
    ASSERT_EQ(plan.actions.size(), plan.nodes.size() + 1) << arch << ": accumulation reduces each unit";
    for (size_t p = 0; p < plan.actions.size(); ++p)
      for (const StepAction& a : plan.actions[p])
        if (a.kind == StepAction::Kind::reduce) {
          EXPECT_EQ(int(p), writes[size_t(a.unit)].last + 1) << arch << ": " << g.units()[size_t(a.unit)].name;
        }
    for (size_t p = 0; p < plan.nodes.size(); ++p)
      for (ValueId v : g.nodes()[plan.nodes[p]].outputs)
        if (g.value(v).placement == Placement::gradient) {
          const GradientWrites& w = writes[size_t(g.params()[size_t(g.value(v).param)].unit)];
          EXPECT_LE(w.first, int(p)) << arch << ": " << g.value(v).name;
          EXPECT_GE(w.last, int(p)) << arch << ": " << g.value(v).name;
        }
    size_t early = 0;
    for (const GradientWrites& w : writes) {
      EXPECT_GE(w.first, 0) << arch << ": every unit has gradients";
      early += w.last < int(plan.nodes.size()) * 9 / 10;
    }
    EXPECT_GT(early, writes.size() / 2) << arch << ": most units' downloads start within the backward";
  }
}

// A staged run holds on the device the parameters the store holds whole (ZeRO 0-2) and the
// micro-batch gradients (ZeRO 0-1); the masters, the optimizer state and the sums stay on the host,
// and ZeRO-2/3's gathered parameters and gradient buffers are the arena's.
TEST(DeviceSelection, StagedDeviceMemoryPlanHoldsOnlyWhatTheStepReads) {
  for (int stage = 0; stage <= 3; ++stage) {
    const recipe::Recipe r =
        quickstart({"precision.mode=bf16", "offload.optimizer=cpu", "distributed.zero_stage=" + std::to_string(stage)})
            .recipe;
    const CompiledStep step = compile_step(r);
    const DeviceMemoryPlan resident = plan_device_memory(step, quickstart({"precision.mode=bf16"}).recipe);
    const DeviceMemoryPlan d = plan_device_memory(step, r);
    EXPECT_EQ(d.parameters, stage < 3 ? resident.parameters : 0) << stage;
    EXPECT_EQ(d.gradients, stage < 2 ? resident.gradients : 0) << stage;
    EXPECT_EQ(d.masters + d.optimizer_state + d.gradient_sum, 0) << stage;
    EXPECT_EQ(d.activations, std::max(step.train.arena_bytes, step.eval.arena_bytes)) << stage;
  }
}

// The GPU plan runs each of GPT's MLPs as two fused nodes (ops/linalg/linear_gelu.h): every gelu and
// gelu_backward node gone into a product; each residual gradient copy into the norm backward that
// adds to it (nn/layernorm.h); and each residual add into the norm that reads its sum
// (nn/add_norm.h); each projection's bias gradient into the norm backward that writes its output
// gradient (nn/layernorm.h). The same FLOPs but the copies', and an arena no larger (the gradient between the
// input-gradient product and GELU's backward, and the copies, never exist).
// run.fusions=false and a CPU plan keep the unfused graph.
TEST(DeviceSelection, AGpuPlanFusesGeluIntoTheProductsAroundIt) {
  auto count = [](const CompiledStep& step, const OpDef& op) {
    int n = 0;
    for (const Node& node : step.model.graph.nodes()) n += node.op == &op;
    return n;
  };
  for (const char* mode : {"fp32", "bf16"}) {
    const std::string precision = std::string("precision.mode=") + mode;
    const recipe::Recipe gpu_recipe = quickstart({precision, "run.device=cuda"}).recipe;
    const int layers = int(gpu_recipe.model.n_layer);
    const CompiledStep gpu = compile_step(gpu_recipe);
    const CompiledStep unfused = compile_step(quickstart({precision, "run.device=cuda", "run.fusions=false"}).recipe);
    const CompiledStep cpu = compile_step(quickstart({precision, "run.device=cpu"}).recipe);
    EXPECT_EQ(gpu.fusions.gelu.forward, layers) << mode;
    EXPECT_EQ(gpu.fusions.gelu.backward, layers) << mode;
    EXPECT_EQ(count(gpu, ops::kLinearGelu), layers) << mode;
    EXPECT_EQ(count(gpu, ops::kLinearBackwardInputGelu), layers) << mode;
    EXPECT_EQ(count(gpu, ops::kGelu) + count(gpu, ops::kGeluBackward), 0) << mode;
    // Each block's two residual gradients: read by the norm's backward instead of copied for it.
    EXPECT_EQ(gpu.fusions.gradient_copies, 2 * layers) << mode;
    EXPECT_EQ(count(gpu, ops::kNormBackwardOnto), 2 * layers) << mode;
    EXPECT_EQ(count(unfused, kAccumulate) - count(gpu, kAccumulate), 2 * layers) << mode;
    // Each residual add and the norm that reads its sum (the next block's ln_1, or ln_f): one node.
    EXPECT_EQ(gpu.fusions.residual_norms, 2 * layers) << mode;
    EXPECT_EQ(count(gpu, ops::kAddNorm), 2 * layers) << mode;
    EXPECT_EQ(count(unfused, ops::kAdd) - count(gpu, ops::kAdd), 2 * layers) << mode;
    // Each block's two projections onto the residual stream: their bias gradients summed by the norm
    // backward that writes their output gradient (ln_2's for the attention's, the next block's ln_1
    // or ln_f for the MLP's); the qkv and fc products keep theirs.
    auto count_if = [](const CompiledStep& step, auto&& pred) {
      int n = 0;
      for (const Node& node : step.model.graph.nodes()) n += pred(node) ? 1 : 0;
      return n;
    };
    const auto biased_weight_gradient = [](const Node& n) {
      return n.op == &ops::kLinearBackwardWeight && n.outputs.size() == 2;
    };
    EXPECT_EQ(gpu.fusions.bias_gradients, 2 * layers) << mode;
    EXPECT_EQ(count_if(unfused, biased_weight_gradient), 4 * layers) << mode;
    EXPECT_EQ(count_if(gpu, biased_weight_gradient), 2 * layers) << mode;
    EXPECT_EQ(count_if(gpu, [](const Node& n) { return ops::sums_norm_output(n); }), 2 * layers) << mode;
    // Rows wider than the norm backward's registers hold the extra sums for keep BGRADB.
    const CompiledStep wide =
        compile_step(quickstart({precision, "run.device=cuda",
                                 std::string("model.n_embd=") + (mode == std::string("fp32") ? "576" : "1152")})
                         .recipe);
    EXPECT_EQ(wide.fusions.bias_gradients, 0) << mode;
    EXPECT_EQ(wide.fusions.gradient_copies, 2 * layers) << mode;
    const double copies_flops = 2.0 * double(layers) * double(gpu_recipe.model.n_embd) *
                                double(*gpu_recipe.train.micro_batch_size * *gpu_recipe.data.sequence_length);
    EXPECT_EQ(gpu.flops_per_micro_batch, unfused.flops_per_micro_batch - copies_flops) << mode;
    EXPECT_LE(gpu.train.arena_bytes, unfused.train.arena_bytes) << mode;
    for (const CompiledStep* plain : {&unfused, &cpu}) {
      EXPECT_EQ(plain->fusions.total(), 0) << mode;
      EXPECT_EQ(count(*plain, ops::kGelu), layers) << mode;
      EXPECT_EQ(count(*plain, ops::kGeluBackward), layers) << mode;
    }
  }
}

}  // namespace
}  // namespace engine::testing
