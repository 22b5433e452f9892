// OpDef: what the graph knows about an operation: its name, its kernels (CPU and CUDA), its gradient
// rule, its FLOP count and its traits. Each op's header in ops/ declares a builder function that
// checks shapes and appends a node; the kernels read and write through a KernelContext. Fields are
// named at the definition (designated initialisers), so a definition says what each value is:
//
//   const OpDef kGelu{.name = "gelu", .cpu = unary_cpu<Gelu>, .cuda = cuda::gelu,
//                     .grad = unary_grad<&kGeluBackward>, .flops = elementwise_flops,
//                     .cheap_to_recompute = true};
//
// The CUDA kernels are declared in ops/cuda_kernels.h; a build without CUDA links ops/no_cuda.cpp,
// whose kernels throw "op X has no CUDA kernel in this build".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace engine {

class GradBuilder;

// The collectives a tensor-parallel op's kernel runs in its group (ops/parallel/tensor_parallel.h):
// the executor binds the run's tensor-parallel communicator (dist/communicator.h) through this, so
// kernels stay below the layer that owns communication. Both calls block until complete; the
// reduction is the communicator's, in rank order, the same bits on every rank.
class GroupCollectives {
 public:
  virtual ~GroupCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over `count` elements of `dtype` (f32, bf16 or f16).
  virtual void all_reduce(void* data, int64_t count, DType dtype, const std::string& what) = 0;
  // `bytes` from every rank into recv (size() * bytes, rank r's at r * bytes).
  virtual void all_gather(const void* send, void* recv, int64_t bytes, const std::string& what) = 0;
};

// The step's identity as a CUDA kernel reads it from device memory at run time (KernelContext::
// step_scalars), so that a captured CUDA graph replays with each step's values; the runner writes it
// before each replay. The same fields as the context's own.
struct StepScalars {
  uint64_t seed = 0, step = 0, micro_step = 0;
  float loss_scale = 1.0f;
};

// Where a kernel finds its values during a step, plus the step's identity for random streams.
// On CUDA, `pointers` are device addresses and the kernel enqueues its work on `stream`; the
// executor owns the stream, the cuBLASLt handle and the workspace.
struct KernelContext {
  const Graph* graph = nullptr;
  Device device;              // where `pointers` live and the kernel runs
  void* stream = nullptr;     // cudaStream_t on CUDA
  void* blas = nullptr;       // cublasLtHandle_t on CUDA
  void* workspace = nullptr;  // device scratch for library calls (cuBLASLt), on CUDA
  size_t workspace_bytes = 0;
  std::vector<void*> pointers;  // indexed by ValueId
  uint64_t seed = 0;
  uint64_t step = 0;        // optimizer step
  uint64_t micro_step = 0;  // micro-batch within the step
  bool training = true;     // false for evaluation and generation: dropout passes values through
  // The tensor-parallel group's collectives (null without tensor parallelism).
  GroupCollectives* tensor_group = nullptr;

  float loss_scale = 1.0f;  // multiplies the loss gradient (fp16 loss scaling)
  // On CUDA, seed, step, micro_step and loss_scale in device memory: kernels that use them read
  // them there (never the fields above), so a CUDA graph of the step needs no re-capture.
  const StepScalars* step_scalars = nullptr;
  // Per ValueId, the type of the memory `pointers` holds: the graph's, or f32 while the executor
  // runs a kernel on widened copies.
  std::vector<DType> dtypes;

  float* f32(ValueId id) const { return static_cast<float*>(pointers[static_cast<size_t>(id)]); }
  void* data(ValueId id) const { return pointers[static_cast<size_t>(id)]; }
  DType dtype(ValueId id) const { return dtypes.empty() ? graph->value(id).dtype : dtypes[static_cast<size_t>(id)]; }
  const int32_t* i32(ValueId id) const { return static_cast<const int32_t*>(pointers[static_cast<size_t>(id)]); }
  const Shape& shape(ValueId id) const { return graph->value(id).shape; }
  // A value as a tensor view, on the context's device.
  Tensor tensor(ValueId id) const {
    const Value& v = graph->value(id);
    return Tensor{pointers[static_cast<size_t>(id)], v.shape, dtype(id), device};
  }
  // Whether output `index` of `node` is added to (gradients) rather than overwritten.
  bool accumulates(const Node& node, size_t index) const {
    return node.accumulate || graph->value(node.outputs[index]).placement == Placement::gradient;
  }
};

// The kernel of every op whose output is its f32 input, element for element: output (+)= input.
// Used by autodiff's gradient accumulation, reshape and dropout in evaluation.
void copy_kernel(const Node& node, const KernelContext& ctx);

using Kernel = void (*)(const Node& node, const KernelContext& ctx);

struct OpDef {
  const char* name = nullptr;
  Kernel cpu = nullptr;
  // The CUDA kernel (ops/cuda_kernels.h): the same contract as `cpu`, on device pointers. It reads
  // and writes f32 unless `cuda_16bit` says otherwise; the executor converts around it.
  Kernel cuda = nullptr;
  // Appends the backward nodes of `node`; nullptr when no gradient flows through the op.
  void (*grad)(GradBuilder& builder, const Node& node) = nullptr;
  // Floating-point operations of one execution (a multiply-add counts 2).
  double (*flops)(const Graph& graph, const Node& node) = nullptr;
  // How the kernel computes when its values are 16-bit ("bf16 matmul, fp32 accumulation"), or
  // nullptr: the kernel reads and writes f32 only, and the executor widens 16-bit values into f32
  // scratch before it runs and rounds its outputs back after (so it computes in fp32).
  const char* native_16bit = nullptr;
  // Outputs (by index, bit i = output i) that stay fp32 in 16-bit precision: statistics and losses.
  uint32_t fp32_outputs = 0;
  // When set, the native 16-bit path exists only for the types it accepts (oneDNN on this CPU).
  bool (*native_for)(DType type) = nullptr;
  // Inputs (bit i = input i) the kernel overwrites in place, as cross-entropy writes the logits'
  // gradient over them: the roofline counts their bytes twice, read and written.
  uint32_t overwritten_inputs = 0;
  // How the CUDA kernel computes on 16-bit values, or nullptr: it reads and writes f32 only, and
  // the executor widens and rounds around it on the device (as native_16bit for the CPU).
  const char* cuda_16bit = nullptr;
  // When set, decides per node whether the CUDA kernel takes the node's 16-bit values as they are
  // (cuDNN's attention for the head sizes it supports), in place of cuda_16bit.
  bool (*cuda_16bit_for)(const Graph& graph, const Node& node) = nullptr;
  // Device scratch the CUDA kernel needs for `node` (KernelContext::workspace), asked once per node
  // when a plan is added, with the device present; nullptr: the runner's default workspace is enough.
  int64_t (*cuda_workspace)(const Graph& graph, const Node& node) = nullptr;
  // Traits the passes read instead of lists of op names:
  bool matmul = false;              // a matrix product: model FLOPs (MFU) count it
  bool cheap_to_recompute = false;  // selective checkpointing recomputes it (graph/recompute.cpp)
  // A collective of the tensor-parallel group, which the unsplit model's graph does not have: node
  // positions that must match the unsplit graph's (dropout's salt) skip it.
  bool tensor_parallel = false;
  // Reads a float model input in the type it comes in: the precision pass casts none for it (a
  // pipeline stage's fp32 edges).
  bool any_float_inputs = false;
};

// Whether `node`'s kernel overwrites its input `index` in place (OpDef::overwritten_inputs).
inline bool overwrites_input(const Node& node, size_t index) {
  return index < 32 && (node.op->overwritten_inputs >> index & 1u);
}
// Whether `node` writes `value`: one of its outputs, or an input its kernel overwrites in place.
bool writes(const Node& node, ValueId value);

// Whether the executor converts this node's 16-bit values around its kernel on `device` (see
// native_16bit and cuda_16bit).
bool needs_conversion(const Graph& graph, const Node& node, Device::Kind device = Device::Kind::cpu);
// f32 bytes of the scratch that conversion needs for `node` (0 when it needs none).
int64_t conversion_bytes(const Graph& graph, const Node& node, Device::Kind device = Device::Kind::cpu);

}  // namespace engine
