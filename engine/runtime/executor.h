// Executor: replays a Plan on the CPU, or on a CUDA device through a DeviceRunner
// (runtime/device_runner.h) when constructed with one. On the CPU it owns the activation arena and the input buffers
// and points every value at its memory once; a step is then a loop over the plan's nodes calling their kernels, with no
// allocation.
//
//   Executor exec(graph, store, /*seed=*/1337);   // store: the model's ParameterStore
//   exec.add_plan("train", plan_step(graph, all_nodes(graph)));
//   std::memcpy(exec.input(tokens), batch.data(), bytes);
//   exec.run("train", step, micro_step);
//   const float* y = exec.value_f32("train", output);   // an activation the plan kept
//
// (tests/core/header_examples_test.cpp compiles and runs this.)
//
// A kernel without a native 16-bit path (OpDef::native_16bit) that meets 16-bit values runs on
// f32 copies: the executor widens them into a scratch buffer, runs the kernel, and rounds its
// outputs back. The scratch is sized from the plans, so it too is known before the first step.
//
// With the op table on (telemetry.op_table) every kernel is timed and summed per op, FLOPs and
// bytes with it; "(communication)" is the time the step spent starting and waiting for its
// collectives. While a trace records (telemetry/trace.h) each node and action is an event.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "graph/op.h"
#include "plan/plan.h"
#include "runtime/device_runner.h"
#include "runtime/parameters.h"
#include "runtime/planned_casts.h"

namespace engine {

// The communication a plan places between nodes (dist/zero_step.h implements it). The executor
// itself zeroes and binds buffers; for a use_params action it binds after run() returns.
class StepCommunication {
 public:
  virtual ~StepCommunication() = default;
  // `buffer`: the action's arena buffer, or null when it names the parameter store's own.
  virtual void run(const StepAction& action, std::byte* buffer) = 0;
};

// One op's time over the timed steps, and the work its nodes did.
struct OpTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // as OpDef::flops counts them
  double bytes = 0;  // bytes of the values each node reads and writes (node_work)
};

// FLOPs and bytes of one execution of `node`. Bytes: its inputs and outputs once each, except that
// an input the kernel overwrites (OpDef::overwritten_inputs) and an output it accumulates into are
// both read and written, so they count twice.
struct NodeWork {
  double flops = 0, bytes = 0;
};
NodeWork node_work(const Graph& graph, const Node& node);

class Executor {
 public:
  // `device`: cpu, or cuda (a UserError in a build without CUDA or on a machine without the device).
  Executor(const Graph& graph, ParameterStore& parameters, uint64_t seed, Device device = {});
  ~Executor();
  Device device() const { return device_; }
  DeviceRunner* runner() { return runner_.get(); }  // null on the CPU
  // The device runner's memory (zeros on the CPU).
  DeviceMemory device_memory() const { return runner_ ? runner_->memory() : DeviceMemory{}; }
  DeviceTimes device_times() const { return runner_ ? runner_->times() : DeviceTimes{}; }

  // Plans share one arena, sized for the largest.
  void add_plan(const std::string& name, Plan plan);
  const Plan& plan(const std::string& name) const { return plans_.at(name); }
  // The graph's values changed type (fp16 to bf16, the same sizes): the device's kernels size their
  // workspace and scratch for the new types, and its captured graphs go.
  void values_retyped() {
    if (runner_)
      for (const auto& [name, plan] : plans_) runner_->add_plan(name, plan);
  }
  void* input(ValueId id) { return inputs_.at(id).data(); }
  // The inputs as written so far start for the device now (DeviceRunner::stage_inputs), ahead of
  // the run() that reads them; nothing to do on the CPU.
  void stage_inputs() {
    if (runner_) runner_->stage_inputs(inputs_);
  }
  float* value_f32(const std::string& plan, ValueId id);  // an activation as placed by a plan
  // `communication` runs the plan's actions; it may be null for a plan without any.
  void run(const std::string& plan, uint64_t step, uint64_t micro_step, float loss_scale = 1.0f,
           StepCommunication* communication = nullptr);
  std::byte* arena_buffer(const std::string& plan, ValueId id);
  int64_t scratch_bytes() const { return scratch_.bytes(); }
  // The tensor-parallel group the kernels of tensor-parallel ops communicate in (outlives this).
  void set_tensor_group(GroupCollectives* group) { tensor_group_ = group; }
  // Time every op from now on (telemetry.op_table), into op_totals().
  void set_op_table(bool on) { op_table_ = on; }
  const std::map<std::string, OpTotals>& op_totals() const { return op_totals_; }

 private:
  const Graph& graph_;
  ParameterStore& parameters_;
  uint64_t seed_;
  Device device_;
  std::map<std::string, Plan> plans_;
  std::map<ValueId, Buffer> inputs_;  // and host values (cpu_checkpointing)
  Buffer arena_;
  Buffer scratch_;    // f32 copies of 16-bit values for kernels without a 16-bit path
  F32Copies copies_;  // planned casts around kernels without a 16-bit path
  // Null on the CPU. Declared after the input buffers so that it is destroyed first (it reads them
  // in stage_inputs; it copies them into staging of its own, so no copy outlives a call).
  std::unique_ptr<DeviceRunner> runner_;
  // Every action at `position`, or only `only` (one of them).
  void run_actions(const Plan& plan, size_t position, KernelContext& ctx, StepCommunication* communication,
                   const StepAction* only = nullptr);
  void run_node(const Node& node, KernelContext& ctx);
  std::vector<std::vector<int>> unit_params_;  // per wrap unit, its parameters' indices
  bool op_table_ = false;
  GroupCollectives* tensor_group_ = nullptr;
  std::map<std::string, OpTotals> op_totals_;
  void run_timed(const Node& node, KernelContext& ctx);
};

}  // namespace engine
