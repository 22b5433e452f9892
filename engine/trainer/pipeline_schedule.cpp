// A pipeline stage's part of a step (Session::pipeline_micro_batches): the schedule of its forward
// and backward passes over the step's micro-batches and what it sends its neighbours between them.
//
// Neighbouring stages talk through a group of two (rank 0 the earlier stage), whose collectives run
// in the order both issue them: an activation on is a broadcast from rank 0, a gradient back one
// from rank 1. Each stage therefore issues its neighbours' transfers in one agreed order. On 1F1B
// stage s runs w = stages - 1 - s forward passes first; then, for each micro-batch j, the forward
// pass of micro-batch w + j, the receipt of j's gradient, the send of w + j's activation and j's
// backward pass; then the backward passes left. The stage after it, one forward pass shorter in
// its warm-up, issues the same transfers in the same order (activation w + j - 1 received before
// gradient j is sent), so no stage waits on one that waits on it. GPipe is every forward pass, then
// every backward pass.
//
// A backward pass reruns the stage's forward pass (the step's "train" plan) from the activation the
// stage received and held, so a micro-batch in flight costs the stage its input alone.
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "telemetry/trace.h"
#include "trainer/session.h"

namespace engine {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

void Session::pipeline_forward(int64_t step, int64_t micro, const Batch& batch, double loss_scale,
                               const std::string& plan) {
  load_batch(batch);
  if (model.stage_input != kNoValue) {
    trace::Scope event("communication", "receive the activation of the stage before");
    const auto start = Clock::now();
    auto* input = static_cast<float*>(executor.input(model.stage_input));
    pipeline.previous->broadcast(input, int64_t(held_inputs_[0].size() * 4), 0, "pipeline activation").wait();
    if (plan == "forward") {  // the training step's: its idle time, and the input its backward reruns from
      pipeline_wait_seconds += since(start);
      std::copy(input, input + held_inputs_[0].size(), held_inputs_[size_t(micro)].begin());
    }
  }
  // The last stage's forward pass is its backward's: it runs there.
  if (plan == "forward" && model.stage_output == kNoValue) return;
  zero.begin_pass(plan == "eval" ? eval_gathers_ : forward_gathers_);
  executor.run(plan, uint64_t(step), uint64_t(micro * world + rank), float(loss_scale), &zero);
  if (model.stage_output == kNoValue) return;
  const float* out = executor.value_f32(plan, model.stage_output);
  std::copy(out, out + handed_on_.size(), handed_on_.begin());
  // Evaluation hands it on at once (no backward to order it against).
  if (plan == "eval")
    pipeline.next->broadcast(handed_on_.data(), int64_t(handed_on_.size() * 4), 0, "pipeline activation").wait();
}

double Session::pipeline_backward(int64_t step, int64_t micro, const Batch& batch, double loss_scale) {
  if (store.sharding().stage < 2) store.zero_micro_grads();
  load_batch(batch);
  if (model.stage_input != kNoValue) {
    const std::vector<float>& held = held_inputs_[size_t(micro)];
    std::copy(held.begin(), held.end(), static_cast<float*>(executor.input(model.stage_input)));
  }
  zero.begin_micro_batch(micro);
  zero.begin_pass(train_gathers_);
  executor.run("train", uint64_t(step), uint64_t(micro * world + rank), float(loss_scale), &zero);
  const double loss = batch_loss("train");
  if (model.stage_input_gradient != kNoValue) {
    trace::Scope event("communication", "send the gradient to the stage before");
    auto* gradient = const_cast<float*>(executor.value_f32("train", model.stage_input_gradient));
    pipeline.previous->broadcast(gradient, int64_t(held_inputs_[0].size() * 4), 1, "pipeline gradient").wait();
  }
  return loss;
}

std::vector<double> Session::pipeline_micro_batches(int64_t step, const std::vector<Batch>& batches,
                                                    double loss_scale) {
  const auto start = Clock::now();
  const auto micro_batches = int64_t(batches.size());
  const bool last = pipeline.stage == pipeline.stages - 1;
  std::vector<double> losses(batches.size(), 0.0);
  auto send_on = [&] {
    if (last) return;
    trace::Scope event("communication", "send the activation to the stage after");
    pipeline.next->broadcast(handed_on_.data(), int64_t(handed_on_.size() * 4), 0, "pipeline activation").wait();
  };
  auto receive_gradient = [&] {
    if (last) return;
    trace::Scope event("communication", "receive the gradient of the stage after");
    const auto wait_start = Clock::now();
    auto* gradient = static_cast<float*>(executor.input(model.stage_output_gradient));
    pipeline.next->broadcast(gradient, int64_t(handed_on_.size() * 4), 1, "pipeline gradient").wait();
    pipeline_wait_seconds += since(wait_start);
  };
  auto forward = [&](int64_t m) { pipeline_forward(step, m, batches[size_t(m)], loss_scale, "forward"); };
  auto backward = [&](int64_t m) { losses[size_t(m)] = pipeline_backward(step, m, batches[size_t(m)], loss_scale); };
  const int64_t warmup = pipeline.schedule == recipe::PipelineSchedule::gpipe
                             ? micro_batches
                             : std::min<int64_t>(pipeline.stages - 1 - pipeline.stage, micro_batches);
  for (int64_t m = 0; m < warmup; ++m) {
    forward(m);
    send_on();
  }
  for (int64_t j = 0; j + warmup < micro_batches; ++j) {  // one forward, one backward
    forward(warmup + j);
    receive_gradient();
    send_on();
    backward(j);
  }
  for (int64_t j = micro_batches - warmup; j < micro_batches; ++j) {
    receive_gradient();
    backward(j);
  }
  pipeline_seconds += since(start);
  ++pipeline_steps;
  return losses;
}

double Session::last_stage_value(double value) {
  if (pipeline.stages == 1) return value;
  pipeline.group->broadcast(&value, sizeof value, pipeline.stages - 1, "the last pipeline stage's value").wait();
  return value;
}

void Session::sync_tied_gradients() {
  if (!pipeline.embedding) return;
  for (size_t u = 0; u < model.graph.units().size(); ++u)
    if (model.graph.units()[u].name.starts_with(kTiedUnitPrefix))
      pipeline.embedding
          ->all_reduce(store.opt_grad(u), store.range_size(u), DType::f32,
                       "all-reduce of " + model.graph.units()[u].name + "'s gradient between the first and last stage")
          .wait();
}

}  // namespace engine
