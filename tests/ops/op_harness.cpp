// The op harness's runner: builds a case's one-op graph, runs its step and checks the forward
// against the double reference and the backward against finite differences (op_harness.h).
#include "op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/convert.h"
#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "linalg/linear.h"
#include "linalg/linear_gelu.h"
#include "nn/add_norm.h"
#include "nn/layernorm.h"
#include "plan/plan.h"
#include "runtime/executor.h"

namespace engine::op_harness {
namespace {

// L = sum(R * y): the harness's loss. inputs y, R (an input value); output L (1).
void weighted_sum_cpu(const Node& node, const KernelContext& ctx) {
  const float* y = ctx.f32(node.inputs[0]);
  const float* r = ctx.f32(node.inputs[1]);
  double sum = 0;
  for (int64_t i = 0; i < ctx.shape(node.inputs[0]).numel(); ++i) sum += double(y[i]) * r[i];
  *ctx.f32(node.outputs[0]) = float(sum);
}
void weighted_sum_grad(GradBuilder& gb, const Node& node) {
  auto t = gb.target(node.inputs[0]);
  gb.emit(kAccumulate, {node.inputs[1]}, {t.value}, t, {}, node.name);
}
// Its loss stays fp32 in 16-bit precision, as the models' per-row losses do; it has no 16-bit
// path, so the executor hands it widened copies.
// On CUDA nothing reads L (its gradient rule seeds dout = R, whatever L is), so its CUDA kernel
// leaves it unwritten: the harness needs no device code of its own.
void weighted_sum_cuda(const Node&, const KernelContext&) {}
const OpDef kWeightedSum{.name = "weighted_sum",
                         .cpu = weighted_sum_cpu,
                         .cuda = weighted_sum_cuda,
                         .grad = weighted_sum_grad,
                         .fp32_outputs = 0b1};

// The unit roundoff of a storage type: half the gap between 1 and the next value.
double unit_roundoff(DType t) { return t == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

double round_to(DType t, double v) {
  if (t == DType::f32) return double(float(v));
  return t == DType::bf16 ? bf16_to_float(float_to_bf16(float(v))) : f16_to_float(float_to_f16(float(v)));
}

// How the engine computes `graph`'s nodes of `op` in their stored types, as `engine plan` prints it.
std::string compute_path(const Graph& graph, const OpDef& op) {
  for (const Node& node : graph.nodes())
    if (node.op == &op) return needs_conversion(graph, node) ? "fp32 on widened copies" : node.op->native_16bit;
  return "-";
}

// The forward output against the double reference, stopping at the first mismatch (reported);
// the worst relative error goes to `worst`.
bool check_forward(const Tensor& expected, const void* got, DType out_type, double tolerance, double& worst) {
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i];
    const float v = load_float(got, out_type, int64_t(i));
    if (tolerance == 0 && v != float(e)) {
      EXPECT_EQ(v, float(e)) << "output " << i;
      return false;
    }
    if (tolerance != 0 && !(std::abs(v - e) <= tolerance * (1 + std::abs(e)))) {
      EXPECT_NEAR(v, e, tolerance * (1 + std::abs(e))) << "output " << i;
      return false;
    }
    worst = std::max(worst, std::abs(v - e) / (1 + std::abs(e)));
  }
  return true;
}

// The parameter gradients against central differences of the reference loss sum(R * reference),
// at about 17 elements of each parameter; the worst relative error goes to `worst`.
void check_finite_differences(const Case& c, const std::vector<Tensor>& inputs, const std::vector<int32_t>& tokens,
                              const Tensor& r, const ParameterStore& store, double tolerance, double& worst) {
  auto reference_loss = [&](const std::vector<Tensor>& x) {
    Tensor y = c.reference(x, tokens);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * r[i];
    return sum;
  };
  for (size_t p = 0; p < inputs.size(); ++p) {
    const float* grad = store.grad(int(p));
    int64_t n = store.numel(int(p));
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / 17)) {
      std::vector<Tensor> x = inputs;
      const double h = 1e-5;
      x[p][size_t(k)] = inputs[p][size_t(k)] + h;
      double up = reference_loss(x);
      x[p][size_t(k)] = inputs[p][size_t(k)] - h;
      double down = reference_loss(x);
      double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[k], numeric, tolerance * (1 + std::abs(numeric))) << "d input " << p << "[" << k << "]";
      worst = std::max(worst, std::abs(grad[k] - numeric) / (1 + std::abs(numeric)));
    }
  }
}

// The step's inputs: the token ids (below the case's range) and the loss's weights R, drawn from
// the test stream of `seed`.
struct CaseInputs {
  std::vector<int32_t> tokens;
  Tensor r;
};

CaseInputs draw_inputs(const Case& c, const CaseGraph& built, uint64_t seed, DType storage) {
  CaseInputs in;
  RandomStream rng(seed, RandomPurpose::test);
  in.tokens.resize(c.tokens.rank() ? static_cast<size_t>(c.tokens.numel()) : 0);
  for (auto& t : in.tokens) t = int32_t(rng.below(uint64_t(c.token_range)));
  in.r.resize(static_cast<size_t>(built.graph.value(built.out).shape.numel()));
  // R is representable in the storage type, so its cast at the start of a 16-bit step is exact.
  for (auto& v : in.r) v = c.weighted ? round_to(storage, rng.normal()) : 1.0;
  return in;
}

// Fills the executor's host input buffers (on CUDA too: the step uploads them).
void set_inputs(Executor& exec, const CaseGraph& built, const CaseInputs& in) {
  if (built.tokens != kNoValue) std::memcpy(exec.input(built.tokens), in.tokens.data(), in.tokens.size() * 4);
  auto* r_buffer = static_cast<float*>(exec.input(built.weights));
  for (size_t i = 0; i < in.r.size(); ++i) r_buffer[i] = float(in.r[i]);
}

}  // namespace

std::unique_ptr<CaseGraph> build_case_graph(const Case& c, DType storage) {
  auto built = std::make_unique<CaseGraph>();
  Graph& g = built->graph;
  int unit = g.add_unit("op");
  for (size_t i = 0; i < c.float_inputs.size(); ++i)
    built->params.push_back(g.add_param("in" + std::to_string(i), c.float_inputs[i], unit, ParamInit::normal(1.0)));
  built->tokens = c.tokens.rank() ? g.add_input("tokens", c.tokens, DType::i32) : kNoValue;
  built->out = c.build(g, built->params, built->tokens);
  built->weights = g.add_input("R", g.value(built->out).shape, DType::f32);
  ValueId loss = g.add_activation("L", Shape{1});
  g.add_node(Node{&kWeightedSum, {built->out, built->weights}, {loss}, {}, false, false, "L"});
  g.set_loss(loss);
  g.mark_forward_end();
  apply_precision(g, storage, DType::f32);
  autodiff(g);
  return built;
}

// Runs case `c` with its values stored in `storage`. In bf16 or fp16 the graph goes through the
// precision pass before autodiff, as the engine's step does: parameters are read from their 16-bit
// copies, activations and their gradients are 16-bit, parameter gradients accumulate in fp32, and
// each node runs its kernel's 16-bit path or (without one) fp32 on widened copies. The reference
// is computed in double from the same 16-bit-rounded inputs.
void run_case(const Case& c, uint64_t seed, const RunOptions& options) {
  const DType storage = options.storage;
  SCOPED_TRACE(c.name + " stored in " + std::string(dtype_name(storage)));
  const std::unique_ptr<CaseGraph> built = build_case_graph(c, storage);
  const Graph& g = built->graph;
  const std::vector<ValueId>& params = built->params;
  const ValueId out = built->out;
  if (options.print_path)
    for (const OpDef* op : {&ops::kLinear, &ops::kLinearBackwardInput, &ops::kLinearBackwardWeight})
      std::cout << "  " << dtype_name(storage) << " " << op->name << ": " << compute_path(g, *op) << '\n';

  ParameterStore store(g);
  store.initialize(seed);
  Executor exec(g, store, seed);
  exec.add_plan("step", plan_step(g, all_nodes(g), {out}));

  const CaseInputs drawn = draw_inputs(c, *built, seed, storage);
  const std::vector<int32_t>& token_values = drawn.tokens;
  const Tensor& r = drawn.r;
  set_inputs(exec, *built, drawn);
  const int64_t n_out = g.value(out).shape.numel();

  // The values the kernels read: the fp32 masters, or their 16-bit copies.
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor x(static_cast<size_t>(store.numel(int(i))));
    for (int64_t k = 0; k < store.numel(int(i)); ++k)
      x[size_t(k)] = load_float(store.param_storage(int(i)), storage, k);
    inputs.push_back(std::move(x));
  }
  store.zero_micro_grads();
  exec.run("step", 0, 0);
  store.widen_gradients();

  // Unit roundoff u of the storage type (2^-8 bf16, 2^-11 fp16). The reference reads the same
  // rounded inputs, so what is left is the kernels' own error: every output is rounded to the type
  // once (|error| <= u |y|) on top of fp32 arithmetic (about 1e-6 relative, far below u), and a
  // gradient meets at most one more rounding on the way back (dy is exact: R is representable;
  // cross-entropy rounds its logits' gradient in place: `rounded_gradient`). So |error| <= u |y|
  // plus fp32 noise (measured worst: 0.8u forward, 0.3u for cross-entropy's gradient), and the
  // bound 2u (1 + |y|) leaves a factor of two. The other ops' parameter gradients are computed in
  // fp32 from the rounded values and accumulate in fp32: they keep the fp32 bound.
  const bool sixteen = storage != DType::f32;
  const double forward_tolerance = sixteen ? 2 * unit_roundoff(storage) : c.forward_tolerance;
  const double backward_tolerance =
      sixteen && options.rounded_gradient ? 2 * unit_roundoff(storage) : c.backward_tolerance;

  // Forward against the double reference.
  Tensor expected = c.reference(inputs, token_values);
  ASSERT_EQ(int64_t(expected.size()), n_out);
  double worst_forward = 0;
  if (!check_forward(expected, exec.value_f32("step", out), g.value(out).dtype, forward_tolerance, worst_forward))
    return;
  if (!c.differentiable) return;
  if (c.straight_through) {
    // The gradient passes through the casts, so it is dy stored in the 16-bit type on the way: the
    // reference applied to R.
    Tensor expected_grad = c.reference({r}, token_values);
    for (size_t p = 0; p < params.size(); ++p)
      for (int64_t k = 0; k < store.numel(int(p)); ++k)
        ASSERT_EQ(store.grad(int(p))[k], float(expected_grad[size_t(k)])) << "straight-through gradient at " << k;
    return;
  }
  // Backward against central differences of the reference loss.
  double worst_backward = 0;
  check_finite_differences(c, inputs, token_values, r, store, backward_tolerance, worst_backward);
  if (std::getenv("OP_HARNESS_REPORT"))
    std::cout << "  " << c.name << " [" << dtype_name(storage) << "]: worst forward " << worst_forward << ", backward "
              << worst_backward << "\n";
}

namespace {

// One step of a built case on `device`: the op's output (as f32) and every parameter's fp32 gradient.
struct DeviceRun {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
};

DeviceRun run_on(const CaseGraph& built, ParameterStore& store, const CaseInputs& in, uint64_t seed, Device device) {
  const Graph& g = built.graph;
  Executor exec(g, store, seed, device);
  exec.add_plan("step", plan_step(g, all_nodes(g), {built.out}));
  set_inputs(exec, built, in);
  store.zero_micro_grads();
  exec.run("step", 0, 0);
  store.widen_gradients();
  DeviceRun run;
  const Value& v = g.value(built.out);
  const float* got = exec.value_f32("step", built.out);
  // The CPU executor hands out the arena's bytes in the stored type, the device runner a host copy
  // widened to f32.
  const DType type = device.kind == Device::Kind::cpu ? v.dtype : DType::f32;
  run.out.resize(size_t(v.shape.numel()));
  for (int64_t i = 0; i < v.shape.numel(); ++i) run.out[size_t(i)] = load_float(got, type, i);
  for (size_t p = 0; p < built.params.size(); ++p) {
    const float* grad = store.grad(int(p));
    run.grads.emplace_back(grad, grad + store.numel(int(p)));
  }
  return run;
}

// `got` against `cpu`, relative to max |cpu|; the first element past `tolerance` is a failure (one
// per tensor). The worst error and the bit-different elements add to `worst`, `comparison`.
void compare_to_cpu(const std::vector<float>& cpu, const std::vector<float>& got, double tolerance,
                    const std::string& what, double& worst, DeviceComparison& comparison) {
  ASSERT_EQ(cpu.size(), got.size()) << what;
  double scale = 0;
  for (float v : cpu) scale = std::max(scale, double(std::abs(v)));
  if (scale == 0) scale = 1;
  bool reported = false;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ++comparison.compared;
    if (std::bit_cast<uint32_t>(cpu[i]) != std::bit_cast<uint32_t>(got[i])) ++comparison.bits_differ;
    const double error = std::abs(double(got[i]) - double(cpu[i])) / scale;
    worst = std::max(worst, std::isnan(error) ? INFINITY : error);
    if (!(error <= tolerance) && !reported) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " against the CPU's " << cpu[i] << ", error " << error
                    << " of max |cpu| " << scale << " > " << tolerance;
      reported = true;
    }
  }
}

const char* device_name(Device device) { return device.kind == Device::Kind::cuda ? "cuda" : "cpu"; }

}  // namespace

DeviceComparison run_case_against_cpu(const Case& c, uint64_t seed, const RunOptions& options, Device device) {
  const DType storage = options.storage;
  SCOPED_TRACE(c.name + " stored in " + std::string(dtype_name(storage)) + ", " + device_name(device) +
               " against the CPU");
  DeviceComparison comparison;
  const std::unique_ptr<CaseGraph> built = build_case_graph(c, storage);
  const CaseInputs in = draw_inputs(c, *built, seed, storage);
  // One store for both runs: the same parameter bits (normal(1) values, no zeros) on both devices.
  ParameterStore store(built->graph);
  store.initialize(seed);
  for (size_t p = 0; p < built->params.size(); ++p) {
    double largest = 0;
    for (int64_t k = 0; k < store.numel(int(p)); ++k)
      largest = std::max(largest, double(std::abs(load_float(store.param_storage(int(p)), storage, k))));
    EXPECT_GT(largest, 0) << "parameter " << p << " is all zeros: the comparison would not see its kernel";
  }
  // A kernel may overwrite an input in place (cross-entropy writes the logits' gradient over them,
  // here a parameter): the second run starts from the parameters the first one did.
  std::vector<std::vector<std::byte>> saved;
  for (size_t p = 0; p < built->params.size(); ++p) {
    const auto* data = static_cast<const std::byte*>(store.param_storage(int(p)));
    saved.emplace_back(data, data + store.numel(int(p)) * int64_t(dtype_size(store.param_dtype())));
  }
  const DeviceRun cpu = run_on(*built, store, in, seed, Device{});
  for (size_t p = 0; p < built->params.size(); ++p)
    std::memcpy(store.param_storage(int(p)), saved[p].data(), saved[p].size());
  // The same values and parameters, the pairs the GPU plan fuses fused.
  std::unique_ptr<CaseGraph> fused = build_case_graph(c, storage);
  if (options.fuse_on_device) {
    const ops::GeluFusions counts = ops::fuse_linear_gelu(fused->graph);
    comparison.fused = counts.forward + counts.backward + ops::fuse_gradient_copies(fused->graph) +
                       ops::fuse_residual_norms(fused->graph) + ops::fuse_norm_bias_gradients(fused->graph);
  }
  const DeviceRun other = run_on(*fused, store, in, seed, device);

  // Tolerances relative to max |cpu| of each tensor (op_harness.h). f32: each device is within the
  // case's tolerance t (1 + |y|) of the reference, so the two within 2 t (1 + M) of each other, M
  // = max |cpu| (and at most 1e-5 of M, far above fp32 summation-order noise at these sizes).
  // 16-bit: the outputs are rounded once to the type, and fp32 noise below an ulp can flip that
  // rounding: one ulp at 1 (2 u: 2^-7 bf16, 2^-10 fp16) of M, twice for the forward and four times
  // for the gradients, which reduce over values that may each differ by an ulp.
  auto f32_tolerance = [&](double case_tolerance, const std::vector<float>& reference) {
    double m = 0;
    for (float v : reference) m = std::max(m, double(std::abs(v)));
    if (m == 0) m = 1;
    return std::min(1e-5, 2 * case_tolerance * (1 + m) / m);
  };
  const bool sixteen = storage != DType::f32;
  const double ulp = 2 * unit_roundoff(storage);
  const double forward_tolerance = c.forward_tolerance == 0 ? 0
                                   : sixteen                ? 2 * ulp * c.rounded_steps
                                                            : f32_tolerance(c.forward_tolerance, cpu.out);
  compare_to_cpu(cpu.out, other.out, forward_tolerance, "output", comparison.worst_forward, comparison);
  if (c.differentiable)
    for (size_t p = 0; p < cpu.grads.size(); ++p) {
      const double backward_tolerance = c.straight_through ? 0
                                        : sixteen          ? 4 * ulp * c.rounded_steps
                                                           : f32_tolerance(c.backward_tolerance, cpu.grads[p]);
      compare_to_cpu(cpu.grads[p], other.grads[p], backward_tolerance, "d input " + std::to_string(p),
                     comparison.worst_backward, comparison);
    }
  if (device.kind != Device::Kind::cpu || std::getenv("OP_HARNESS_REPORT"))
    std::cout << "  " << c.name << " [" << dtype_name(storage) << "] " << device_name(device)
              << " against cpu: worst forward " << comparison.worst_forward << " (tolerance " << forward_tolerance
              << "), backward " << comparison.worst_backward << "; bit-different " << comparison.bits_differ << " of "
              << comparison.compared << (comparison.bits_differ == 0 ? " (bit-equal)" : "")
              << (comparison.fused ? "; " + std::to_string(comparison.fused) + " fused nodes" : std::string()) << "\n";
  return comparison;
}

}  // namespace engine::op_harness
