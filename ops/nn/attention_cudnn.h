// causal_attention (nn/attention.h) in 16-bit storage through cuDNN's fused SDPA, forward and
// backward, by the cuDNN frontend's graph API (ops/nn/attention_cudnn.cpp, its own translation unit:
// the frontend's headers take over a minute to compile).
//
// A node goes to cuDNN when cudnn_attention_supports() says so: a build with cuDNN and the frontend
// (ENGINE_HAVE_CUDNN), qkv/out (and dout/dqkv) all bf16 or all f16, the lse f32, head size a
// multiple of 8 up to 128, and T >= 2. Its values are then read and written in 16 bits where they
// lie (no conversion): q, k, v and dq, dk, dv are strided views of the packed rows, the lse is
// cuDNN's natural-log stats. Every other node runs the engine's fp32 kernels (nn/attention.cu).
//
//   if (cudnn_attention_supports(graph, node)) bytes = cudnn_attention_workspace(graph, node);  // plan time
//   cudnn_attention_forward(node, ctx);  // from cuda::attention when the node's values are 16-bit
//
// Frontend graphs are built once per (device, direction, dtype, shape) on first use and cached with
// their workspace size; each call sets the device's cuDNN handle to ctx.stream. The backward uses
// cuDNN's deterministic algorithm, or its faster non-deterministic one where the node allows
// unordered sums (nn/attention.h allow_unordered_attention_sums, run.deterministic: false). A backward whose dqkv
// accumulates (autodiff adds into an existing gradient: qkv with several consumers, or a parameter) writes into
// workspace scratch and adds it in fp32, rounding once.
//
// A build without cuDNN defines these inline: nothing is supported and the engine's kernels run.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "graph/op.h"

namespace engine::cuda {

// One SDPA problem in the engine's layout: the packed qkv (B, T, (H + 2 KV) hd), out (B, T, H hd),
// lse (B, H, T) f32.
struct SdpaProblem {
  int64_t batch = 0, time = 0, heads = 0, kv_heads = 0, head_size = 0;
  DType type = DType::bf16;  // bf16 or f16
  bool backward = false;
  bool deterministic = true;  // backward: dq summed in a fixed order (false: run.deterministic false)
};

#if defined(ENGINE_HAVE_CUDNN) && ENGINE_HAVE_CUDNN

inline constexpr bool kHaveCudnnAttention = true;

// Host only, allocates nothing (the executor may ask for every node of every step): whether `node`
// (a causal_attention or causal_attention_backward node) runs on cuDNN, from the graph's values.
bool cudnn_attention_supports(const Graph& graph, const Node& node);
// Device workspace bytes the node needs on the current device: cuDNN's, plus the scratch of an
// accumulating backward. Builds (and caches) the node's cuDNN graph: needs a device. 0 when the
// node is not supported.
int64_t cudnn_attention_workspace(const Graph& graph, const Node& node);
// The kernels: the contract of cuda::attention / attention_backward, on the node's 16-bit values.
void cudnn_attention_forward(const Node& node, const KernelContext& ctx);
void cudnn_attention_backward(const Node& node, const KernelContext& ctx);

// Without a device: builds the frontend graph of `problem` and runs its validate() for SM
// `sm_version` (90: Hopper). "" when cuDNN's support surface takes it, else the frontend's message.
std::string cudnn_attention_validate(const SdpaProblem& problem, int sm_version);
// For `engine --version`: "yes (cuDNN 9.19.0 loaded, built with 9.19.0, frontend 1.32.0)".
std::string cudnn_attention_summary();

#else

inline constexpr bool kHaveCudnnAttention = false;

inline bool cudnn_attention_supports(const Graph&, const Node&) { return false; }
inline int64_t cudnn_attention_workspace(const Graph&, const Node&) { return 0; }
[[noreturn]] inline void cudnn_attention_forward(const Node&, const KernelContext&) {
  throw InternalError("causal_attention: this build has no cuDNN SDPA");
}
[[noreturn]] inline void cudnn_attention_backward(const Node&, const KernelContext&) {
  throw InternalError("causal_attention backward: this build has no cuDNN SDPA");
}
inline std::string cudnn_attention_validate(const SdpaProblem&, int) { return "this build has no cuDNN SDPA"; }
inline std::string cudnn_attention_summary() { return "no (not built with cuDNN)"; }

#endif

}  // namespace engine::cuda
