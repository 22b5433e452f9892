// The op harness: every op's forward kernel against a plain double-precision reference, and its
// backward (through autodiff, as training runs it) against central finite differences of that
// reference, on random shapes including odd sizes.
//
// Each case builds a one-op graph whose float inputs are parameters (so their gradients land in
// the gradient buffers) and ends in a weighted sum L = sum(R * out) with fixed random weights R,
// whose gradient rule seeds dout = R. The cases and the fp32 suite are in op_harness_test.cpp, the
// same cases in bf16 and fp16 storage in op_harness_16bit_test.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace engine::op_harness {

using Tensor = std::vector<double>;

struct Case {
  std::string name;
  std::vector<Shape> float_inputs;  // become parameters
  Shape tokens;                     // optional i32 input
  int64_t token_range = 0;
  // Builds the op from the parameter values (and the token input); returns its output.
  std::function<ValueId(Graph&, const std::vector<ValueId>&, ValueId tokens)> build;
  // The same op in double precision.
  std::function<Tensor(const std::vector<Tensor>&, const std::vector<int32_t>&)> reference;
  double forward_tolerance = 1e-4;
  // fp32 kernels against finite differences of the double reference (h = 1e-5 in double: the
  // truncation error h^2/6 times the third derivative and the cancellation 1e-16 |L| / h are both
  // below 1e-9 here, so what is measured is the kernel's own fp32 error). A gradient here is a sum
  // of at most ~20 products of O(1) values, each step rounding at 2^-24 = 6e-8: at most about
  // 20 * 2^-24 = 1.2e-6 of (1 + |g|). Measured worst over the 8 seeds: 3.3e-7 (linear, matmul),
  // 2.3e-7 (norms), 2.1e-7 (attention). 2e-6 keeps that bound with a little room.
  double backward_tolerance = 2e-6;
  bool weighted = true;           // false for the loss op, whose gradient ignores R (R = 1)
  bool straight_through = false;  // the gradient is the op applied to dy (rounding), not finite differences
  bool differentiable = true;     // false for ops without a gradient rule (host_copy): forward only
  // 16-bit device comparisons: ops in sequence whose rounded outputs feed the next (a flip in one
  // moves the next by up to an ulp of its own): the bounds scale with it.
  int rounded_steps = 1;
  // fusion_cases: how many nodes the GPU plan's fusion passes fuse in the case's graph.
  int fused_nodes = 0;
};

struct RunOptions {
  DType storage = DType::f32;     // where the graph's values are stored (bf16, fp16: through the precision pass)
  bool rounded_gradient = false;  // 16-bit: the parameters' gradient is rounded to the storage type on its way
  bool print_path = false;        // print how the linear ops compute in this storage type
  // run_case_against_cpu: the other device runs the graph after the GPU plan's fusion passes
  // (ops/linalg/linear_gelu.h, nn/layernorm.h), the CPU the unfused graph: each fused kernel
  // against its unfused CPU composition.
  bool fuse_on_device = true;
};

// Runs case `c`: its forward against the reference, then its backward against finite differences.
void run_case(const Case& c, uint64_t seed, const RunOptions& options = {});

// A case's one-op graph, through the precision pass and autodiff as run_case runs it.
struct CaseGraph {
  Graph graph;
  std::vector<ValueId> params;  // the case's float inputs, as parameters
  ValueId tokens = kNoValue;    // the i32 input, if any
  ValueId out = kNoValue;       // the op's output
  ValueId weights = kNoValue;   // R, the loss's weights (an f32 input)
};
// Built in place (the executor keeps a reference to the graph): hold it by the pointer.
std::unique_ptr<CaseGraph> build_case_graph(const Case& c, DType storage);

// Runs case `c` on the CPU and on `device` (CUDA device 0 unless told) from the same parameters
// and inputs (random normal values, the same bits on both), and compares the forward output and
// every parameter gradient, `device` against the CPU, relative to max |cpu| of each tensor:
//   f32:  twice the case's tolerance against the double reference (each device is within it),
//         at most 1e-5; 0 for cases exact against the reference (forward_tolerance 0, straight-through).
//   bf16, fp16: the type's ulp at 1 (2^-7, 2^-10): one rounding flipped by fp32 noise, times 2 for
//         the forward and 4 for the gradients (reductions over values that may differ by an ulp).
// Prints the worst relative errors and how many elements differ in their bits (reported, never a
// failure) on one line per case.
struct DeviceComparison {
  double worst_forward = 0, worst_backward = 0;  // relative to max |cpu| of each tensor
  int64_t compared = 0;                          // elements compared (output and gradients)
  int64_t bits_differ = 0;                       // of them, not bit-equal
  int fused = 0;                                 // nodes the other device ran fused
};
DeviceComparison run_case_against_cpu(const Case& c, uint64_t seed, const RunOptions& options = {},
                                      Device device = Device{Device::Kind::cuda, 0});

// Every op's case, on shapes drawn from `shape_rng`.
std::vector<Case> cases(std::mt19937& shape_rng);
// Op sequences the GPU plan fuses: GPT's MLP (linear, gelu, linear), on odd shapes and on shapes
// whose sizes are multiples of 8 (cuBLASLt's GELU epilogues need them); a residual stream through a
// norm (h + norm(h)), whose gradient copy the norm's backward reads instead.
std::vector<Case> fusion_cases(std::mt19937& shape_rng);

}  // namespace engine::op_harness
