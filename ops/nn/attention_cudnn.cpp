// causal_attention through cuDNN's fused SDPA (nn/attention_cudnn.h), with the cuDNN frontend's
// header-only graph API. Compiled only where CMake found cuDNN and the frontend (ENGINE_HAVE_CUDNN).
//
// Layout: the packed qkv (B, T, (H + 2 KV) hd) gives q, k and v as 4-d strided views (no copies),
// dims (B, heads, T, hd), strides (T row, hd, row, 1) with row = (H + 2 KV) hd, at element offsets
// 0, H hd and (H + KV) hd; out and dout are (B, H, T, hd) with strides (T H hd, hd, H hd, 1); the
// lse is cuDNN's stats (B, H, T, 1), fp32, natural log (stats_use_log2 off). dq, dk and dv are the
// same views of the packed dqkv. Causal mask top-left (T x T), attn_scale 1/sqrt(hd).
#include "nn/attention_cudnn.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "cuda_convert.h"
#include "nn/attention.h"

namespace engine::cuda {

namespace {

namespace fe = cudnn_frontend;

// The frontend tensors' uids, the keys of the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

std::string describe(const SdpaProblem& p) {
  return std::string(p.backward ? (p.deterministic ? "backward" : "backward (unordered sums)") : "forward") + ", " +
         std::string(dtype_name(p.type)) + ", B " + std::to_string(p.batch) + " T " + std::to_string(p.time) +
         " heads " + std::to_string(p.heads) + " kv_heads " + std::to_string(p.kv_heads) + " head size " +
         std::to_string(p.head_size);
}

[[noreturn]] void fail(const SdpaProblem& p, const std::string& step, const std::string& message) {
  throw InternalError("causal_attention on cuDNN SDPA (" + describe(p) + "): " + step + ": " + message);
}

void check_fe(fe::error_t status, const SdpaProblem& p, const char* step) {
  if (status.is_bad()) fail(p, step, status.get_message());
}

void check_cudnn(cudnnStatus_t status, const char* step) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw InternalError(std::string("causal_attention on cuDNN: ") + step + ": " + cudnnGetErrorString(status));
}

// The node's problem from the graph's values, or batch 0 when cuDNN does not take it. Allocates
// nothing (the executor asks for every node of every step).
SdpaProblem problem_of(const Graph& graph, const Node& node) {
  SdpaProblem p;
  p.backward = node.op == &ops::kCausalAttentionBackward;
  if (!p.backward && node.op != &ops::kCausalAttention) return {};
  if (node.inputs.size() != (p.backward ? 4u : 1u) || node.outputs.size() != (p.backward ? 1u : 2u) ||
      node.attrs.ints.size() < 2)
    return {};
  // forward: qkv -> out, lse.  backward: dout, qkv, out, lse -> dqkv.
  const ValueId qkv_id = node.inputs[p.backward ? 1 : 0];
  const ValueId lse_id = p.backward ? node.inputs[3] : node.outputs[1];
  const Value& qkv = graph.value(qkv_id);
  p.type = qkv.dtype;
  if (!is_16bit(p.type) || graph.value(lse_id).dtype != DType::f32) return {};
  if (p.backward) {
    for (ValueId id : {node.inputs[0], node.inputs[2], node.outputs[0]})
      if (graph.value(id).dtype != p.type) return {};
  } else if (graph.value(node.outputs[0]).dtype != p.type) {
    return {};
  }
  const Shape& s = qkv.shape;
  const int64_t heads = node.attrs.ints[0], kv_heads = node.attrs.ints[1];
  if (s.rank() != 3 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || s[2] % (heads + 2 * kv_heads) != 0)
    return {};
  p.batch = s[0];
  p.time = s[1];
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_size = s[2] / (heads + 2 * kv_heads);
  p.deterministic = !(p.backward && ops::attention_sums_unordered(node));
  // cuDNN's fp16/bf16 surface on sm_80 to sm_100: head size a multiple of 8 (16-byte rows, which
  // also keeps every view's offset and stride 16-byte aligned), up to 128 on every architecture; a
  // backward of s_q = s_kv = 1 is refused, so T >= 2 both ways.
  if (p.batch < 1 || p.time < 2 || p.head_size % 8 != 0 || p.head_size < 8 || p.head_size > 128) return {};
  return p;
}

std::vector<int64_t> qkv_strides(const SdpaProblem& p) {
  const int64_t row = (p.heads + 2 * p.kv_heads) * p.head_size;
  return {p.time * row, p.head_size, row, 1};
}
std::vector<int64_t> out_strides(const SdpaProblem& p) {
  const int64_t c = p.heads * p.head_size;
  return {p.time * c, p.head_size, c, 1};
}

// The frontend graph of one problem, not yet validated or built. `sm_version` 0: the current
// device's. The SDPA node copies the graph's context when it is added, so the SM version (as the
// data types) is set before.
std::shared_ptr<fe::graph::Graph> make_graph(const SdpaProblem& p, int sm_version = 0) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(p.type == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = p.batch, T = p.time, H = p.heads, KV = p.kv_heads, hd = p.head_size;
  auto tensor = [&](const char* name, int64_t uid, std::vector<int64_t> dim, std::vector<int64_t> stride) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  auto q = tensor("Q", kQ, {B, H, T, hd}, qkv_strides(p));
  auto k = tensor("K", kK, {B, KV, T, hd}, qkv_strides(p));
  auto v = tensor("V", kV, {B, KV, T, hd}, qkv_strides(p));
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<int64_t> stats_dim{B, H, T, 1}, stats_stride{H * T, T, 1, 1};
  if (!p.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("causal_attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
    auto [o, stats] = g->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim({B, H, T, hd}).set_stride(out_strides(p));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    auto o = tensor("O", kO, {B, H, T, hd}, out_strides(p));
    auto d_o = tensor("dO", kDO, {B, H, T, hd}, out_strides(p));
    auto stats = tensor("Stats", kStats, stats_dim, stats_stride);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("causal_attention_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(p.deterministic);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim({B, H, T, hd}).set_stride(qkv_strides(p));
    dk->set_output(true).set_uid(kDK).set_dim({B, KV, T, hd}).set_stride(qkv_strides(p));
    dv->set_output(true).set_uid(kDV).set_dim({B, KV, T, hd}).set_stride(qkv_strides(p));
  }
  return g;
}

// One cuDNN handle per device, created on first use and kept for the process; `lock` serialises
// setting its stream and enqueueing on it.
struct DeviceHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex lock;
};

DeviceHandle& handle_for(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceHandle>> handles;
  std::lock_guard<std::mutex> guard(mutex);
  auto& slot = handles[device];
  if (!slot) {
    auto h = std::make_unique<DeviceHandle>();
    check_cudnn(cudnnCreate(&h->handle), "cudnnCreate");
    slot = std::move(h);
  }
  return *slot;
}

int current_device() {
  int device = 0;
  if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess)
    throw InternalError(std::string("causal_attention on cuDNN: cudaGetDevice: ") + cudaGetErrorString(status));
  return device;
}

// A built graph and its workspace, per (device, problem).
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, DType, bool, bool>;

// Validates and builds the graph of `p` for the device's handle; throws where cuDNN cannot.
std::unique_ptr<Built> build(const SdpaProblem& p, int device) {
  auto built = std::make_unique<Built>();
  try {
    DeviceHandle& h = handle_for(device);
    built->graph = make_graph(p);
    fe::graph::Graph& g = *built->graph;
    check_fe(g.validate(), p, "validate");
    check_fe(g.build_operation_graph(h.handle), p, "build_operation_graph");
    check_fe(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), p, "create_execution_plans");
    check_fe(g.check_support(), p, "check_support");
    check_fe(g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), p, "build_plans");
    check_fe(g.get_workspace_size(built->workspace), p, "get_workspace_size");
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {  // the frontend throws for a library it cannot load
    fail(p, "building the graph", e.what());
  }
  return built;
}

// The built graph of `p`, once per (device, problem). A backward that may sum in any order
// (run.deterministic: false) and that cuDNN cannot build for the shape runs the deterministic one,
// said once: the stricter guarantee, not a failed run.
const Built& built_for(const SdpaProblem& p, int device) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Built>> cache;
  const Key key{device, p.batch, p.time, p.heads, p.kv_heads, p.head_size, p.type, p.backward, p.deterministic};
  std::lock_guard<std::mutex> guard(mutex);
  auto& slot = cache[key];
  if (slot) return *slot;
  try {
    slot = build(p, device);
  } catch (const InternalError& e) {
    if (!p.backward || p.deterministic) {
      cache.erase(key);
      throw;
    }
    SdpaProblem ordered = p;
    ordered.deterministic = true;
    try {
      slot = build(ordered, device);
    } catch (...) {
      cache.erase(key);
      throw;
    }
    spdlog::warn("cuDNN has no unordered attention backward for this shape ({}); it runs the deterministic one",
                 e.what());
  }
  return *slot;
}

// Bytes of the dqkv scratch an accumulating backward writes before adding.
int64_t scratch_bytes(const SdpaProblem& p) {
  return p.batch * p.time * (p.heads + 2 * p.kv_heads) * p.head_size * int64_t(dtype_size(p.type));
}

bool accumulates(const Graph& graph, const Node& node) {
  return node.accumulate || graph.value(node.outputs[0]).placement == Placement::gradient;
}

int64_t workspace_of(const Graph& graph, const Node& node, const SdpaProblem& p, int64_t cudnn_bytes) {
  if (!p.backward || !accumulates(graph, node)) return cudnn_bytes;
  return aligned(cudnn_bytes) + scratch_bytes(p);
}

// The problem of a node the executor hands over, its values checked against the 16-bit types the
// graph says (so a call with widened f32 copies fails loudly instead of reading garbage).
SdpaProblem checked_problem(const Node& node, const KernelContext& ctx) {
  const SdpaProblem p = problem_of(*ctx.graph, node);
  if (p.batch == 0)
    throw InternalError("causal_attention node " + node.name + " was sent to cuDNN SDPA, which does not take it");
  for (const auto& ids : {node.inputs, node.outputs})
    for (ValueId id : ids)
      if (ctx.dtype(id) != ctx.graph->value(id).dtype)
        throw InternalError("causal_attention node " + node.name +
                            " on cuDNN SDPA: the executor converted its values; it reads them in " +
                            std::string(dtype_name(p.type)));
  return p;
}

void execute(const SdpaProblem& p, const Built& built, int device, const KernelContext& ctx,
             std::unordered_map<int64_t, void*>& pack) {
  if (built.workspace > 0 && (ctx.workspace == nullptr || int64_t(ctx.workspace_bytes) < built.workspace))
    fail(p, "workspace",
         "needs " + std::to_string(built.workspace) + " bytes, the executor gave " +
             std::to_string(ctx.workspace_bytes) + " (size it with cudnn_attention_workspace)");
  DeviceHandle& h = handle_for(device);
  std::lock_guard<std::mutex> guard(h.lock);
  check_cudnn(cudnnSetStream(h.handle, static_cast<cudaStream_t>(ctx.stream)), "cudnnSetStream");
  check_fe(built.graph->execute(h.handle, pack, ctx.workspace), p, "execute");
}

std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }

}  // namespace

bool cudnn_attention_supports(const Graph& graph, const Node& node) { return problem_of(graph, node).batch != 0; }

int64_t cudnn_attention_workspace(const Graph& graph, const Node& node) {
  const SdpaProblem p = problem_of(graph, node);
  if (p.batch == 0) return 0;
  return workspace_of(graph, node, p, built_for(p, current_device()).workspace);
}

// inputs qkv; outputs out (B, T, H hd), lse (B, H, T)
void cudnn_attention_forward(const Node& node, const KernelContext& ctx) {
  const SdpaProblem p = checked_problem(node, ctx);
  const int device = current_device();
  const Built& built = built_for(p, device);
  const int64_t e = int64_t(dtype_size(p.type)), hd = p.head_size;
  std::byte* qkv = bytes(ctx.data(node.inputs[0]));
  std::unordered_map<int64_t, void*> pack{{kQ, qkv},
                                          {kK, qkv + p.heads * hd * e},
                                          {kV, qkv + (p.heads + p.kv_heads) * hd * e},
                                          {kO, ctx.data(node.outputs[0])},
                                          {kStats, ctx.data(node.outputs[1])}};
  execute(p, built, device, ctx, pack);
}

// inputs dout, qkv, out, lse; output dqkv (added to when the node accumulates)
void cudnn_attention_backward(const Node& node, const KernelContext& ctx) {
  const SdpaProblem p = checked_problem(node, ctx);
  const int device = current_device();
  const Built& built = built_for(p, device);
  const int64_t e = int64_t(dtype_size(p.type)), hd = p.head_size;
  const bool accumulate = ctx.accumulates(node, 0);
  const int64_t need = workspace_of(*ctx.graph, node, p, built.workspace);
  if (int64_t(ctx.workspace_bytes) < need || (need > 0 && ctx.workspace == nullptr))
    fail(p, "workspace",
         "needs " + std::to_string(need) + " bytes" +
             (accumulate ? " (cuDNN's and the accumulated dqkv's scratch)" : "") + ", the executor gave " +
             std::to_string(ctx.workspace_bytes) + " (size it with cudnn_attention_workspace)");
  std::byte* qkv = bytes(ctx.data(node.inputs[1]));
  std::byte* dqkv = accumulate ? bytes(ctx.workspace) + aligned(built.workspace) : bytes(ctx.data(node.outputs[0]));
  const int64_t k_offset = p.heads * hd * e, v_offset = (p.heads + p.kv_heads) * hd * e;
  std::unordered_map<int64_t, void*> pack{{kQ, qkv},
                                          {kK, qkv + k_offset},
                                          {kV, qkv + v_offset},
                                          {kO, ctx.data(node.inputs[2])},
                                          {kDO, ctx.data(node.inputs[0])},
                                          {kStats, ctx.data(node.inputs[3])},
                                          {kDQ, dqkv},
                                          {kDK, dqkv + k_offset},
                                          {kDV, dqkv + v_offset}};
  execute(p, built, device, ctx, pack);
  if (accumulate) {
    const int64_t n = scratch_bytes(p) / e;
    add_arrays(ctx.data(node.outputs[0]), dqkv, ctx.data(node.outputs[0]), p.type, n, ctx.stream);
  }
}

std::string cudnn_attention_validate(const SdpaProblem& problem, int sm_version) {
  try {
    auto g = make_graph(problem, sm_version);
    fe::error_t status = g->validate();
    return status.is_good() ? std::string() : status.get_message();
  } catch (const std::exception& e) {
    return std::string("the frontend threw: ") + e.what();
  }
}

std::string cudnn_attention_summary() {
  const size_t loaded = cudnnGetVersion();
  auto version = [](size_t v) {
    return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
  };
  return "yes (cuDNN " + version(loaded) + " loaded, built with " + version(CUDNN_VERSION) + ", frontend " +
         std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
}

}  // namespace engine::cuda
