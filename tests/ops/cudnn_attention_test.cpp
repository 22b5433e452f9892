// causal_attention on cuDNN's fused SDPA (ops/nn/attention_cudnn.h).
//
//   CudnnAttention (label ops, no device): the frontend graphs of our layouts (packed qkv, GQA,
//     natural-log stats) pass validate() for sm_90, forward and backward, fp16 and bf16; head size
//     20 is refused there and by cudnn_attention_supports, as are f32 values and T = 1.
//   CudnnAttentionGpu (label cuda, skips without a device): cuDNN's forward and backward against
//     the engine's fp32 CUDA kernels on the same 16-bit-rounded inputs, within 16-bit tolerances;
//     the deterministic backward twice gives the same bits; an accumulating backward adds; the
//     backward with unordered sums (run.deterministic: false) within the same tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/device_info.h"
#include "cuda_kernels.h"
#include "nn/attention.h"
#include "nn/attention_cudnn.h"

#if defined(ENGINE_HAVE_CUDNN) && ENGINE_HAVE_CUDNN
#include <cuda_runtime.h>
#endif

namespace engine {
namespace {

using cuda::SdpaProblem;

constexpr const char* kNoCudnn =
    "this build has no cuDNN SDPA (cmake found no cuDNN or no frontend headers: scripts/setup --deps)";

// An attention node's values in `type` (the lse f32): forward qkv -> out, lse, or backward
// dout, qkv, out, lse -> dqkv.
struct AttentionGraph {
  Graph graph;
  ValueId qkv, out, lse, dout, dqkv;
  Node forward, backward;
};

AttentionGraph attention_graph(const SdpaProblem& p, DType type) {
  AttentionGraph a;
  Graph& g = a.graph;
  const int64_t row = (p.heads + 2 * p.kv_heads) * p.head_size, c = p.heads * p.head_size;
  a.qkv = g.add_input("qkv", Shape{p.batch, p.time, row}, type);
  a.out = g.add_activation("attn.out", Shape{p.batch, p.time, c}, type);
  a.lse = g.add_activation("attn.lse", Shape{p.batch, p.heads, p.time}, DType::f32);
  a.dout = g.add_activation("dattn.out", Shape{p.batch, p.time, c}, type);
  a.dqkv = g.add_activation("dqkv", Shape{p.batch, p.time, row}, type);
  const Attrs attrs{{p.heads, p.kv_heads}, {}};
  a.forward = Node{&ops::kCausalAttention, {a.qkv}, {a.out, a.lse}, attrs, false, false, "attn"};
  a.backward =
      Node{&ops::kCausalAttentionBackward, {a.dout, a.qkv, a.out, a.lse}, {a.dqkv}, attrs, false, true, "attn"};
  g.add_node(a.forward);
  g.add_node(a.backward);
  if (!p.deterministic) {
    EXPECT_EQ(ops::allow_unordered_attention_sums(g), 1);
    a.backward = g.nodes().back();
  }
  return a;
}

std::string name(const SdpaProblem& p) {
  return std::string(p.backward ? (p.deterministic ? "backward " : "unordered backward ") : "forward ") +
         std::string(dtype_name(p.type)) + " B" + std::to_string(p.batch) + " T" + std::to_string(p.time) + " H" +
         std::to_string(p.heads) + " KV" + std::to_string(p.kv_heads) + " hd" + std::to_string(p.head_size);
}

TEST(CudnnAttention, OurLayoutsValidateForHopper) {
  if (!cuda::kHaveCudnnAttention) GTEST_SKIP() << kNoCudnn;
  for (int64_t kv_heads : {12, 4})  // GPT-2 (12 heads), Llama-style GQA (12 query, 4 key/value heads)
    for (DType type : {DType::bf16, DType::f16})
      for (int variant : {0, 1, 2}) {  // forward, backward, backward with unordered sums
        const bool backward = variant > 0;
        const SdpaProblem p{.batch = 4,
                            .time = 1024,
                            .heads = 12,
                            .kv_heads = kv_heads,
                            .head_size = 64,
                            .type = type,
                            .backward = backward,
                            .deterministic = variant < 2};
        EXPECT_EQ(cuda::cudnn_attention_validate(p, 90), "") << name(p);
        const AttentionGraph a = attention_graph(p, type);
        EXPECT_TRUE(cuda::cudnn_attention_supports(a.graph, backward ? a.backward : a.forward)) << name(p);
      }
}

TEST(CudnnAttention, HeadSize20IsRefused) {
  if (!cuda::kHaveCudnnAttention) GTEST_SKIP() << kNoCudnn;
  for (bool backward : {false, true}) {
    const SdpaProblem p{.batch = 4,
                        .time = 1024,
                        .heads = 12,
                        .kv_heads = 4,
                        .head_size = 20,
                        .type = DType::bf16,
                        .backward = backward};
    const std::string why = cuda::cudnn_attention_validate(p, 90);
    EXPECT_NE(why, "") << name(p) << ": cuDNN's validate() took head size 20";
    std::cout << name(p) << ": " << why << "\n";
    const AttentionGraph a = attention_graph(p, DType::bf16);
    EXPECT_FALSE(cuda::cudnn_attention_supports(a.graph, backward ? a.backward : a.forward)) << name(p);
  }
}

TEST(CudnnAttention, SupportsOnly16BitValuesAndTheShapesCudnnTakes) {
  if (!cuda::kHaveCudnnAttention) GTEST_SKIP() << kNoCudnn;
  auto supported = [](int64_t time, int64_t head_size, DType type) {
    const SdpaProblem p{.batch = 2, .time = time, .heads = 4, .kv_heads = 2, .head_size = head_size};
    const AttentionGraph a = attention_graph(p, type);
    const bool forward = cuda::cudnn_attention_supports(a.graph, a.forward);
    EXPECT_EQ(forward, cuda::cudnn_attention_supports(a.graph, a.backward)) << time << " " << head_size;
    return forward;
  };
  EXPECT_TRUE(supported(100, 64, DType::bf16));
  EXPECT_TRUE(supported(100, 8, DType::f16));
  EXPECT_TRUE(supported(100, 128, DType::bf16));
  EXPECT_FALSE(supported(100, 64, DType::f32));  // the engine's fp32 kernels
  EXPECT_FALSE(supported(100, 20, DType::bf16));
  EXPECT_FALSE(supported(100, 136, DType::bf16));  // over 128: not on every architecture
  EXPECT_FALSE(supported(1, 64, DType::bf16));     // cuDNN's backward refuses s_q = s_kv = 1
  // Mixed types (a 16-bit qkv with an f32 out) stay on the converting path.
  const SdpaProblem p{.batch = 2, .time = 100, .heads = 4, .kv_heads = 2, .head_size = 64};
  AttentionGraph a = attention_graph(p, DType::bf16);
  a.graph.mutable_value(a.out).dtype = DType::f32;
  EXPECT_FALSE(cuda::cudnn_attention_supports(a.graph, a.forward));
  EXPECT_FALSE(cuda::cudnn_attention_supports(a.graph, a.backward));
}

#if defined(ENGINE_HAVE_CUDNN) && ENGINE_HAVE_CUDNN

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Device memory for each value of a graph, freed at the end.
struct DeviceValues {
  std::vector<void*> pointers;
  explicit DeviceValues(const Graph& g) : pointers(g.values().size(), nullptr) {
    for (size_t i = 0; i < pointers.size(); ++i) {
      const Value& v = g.values()[i];
      check_cuda(cudaMalloc(&pointers[i], size_t(std::max<int64_t>(1, v.shape.numel())) * dtype_size(v.dtype)),
                 "cudaMalloc");
    }
  }
  ~DeviceValues() {
    for (void* p : pointers) cudaFree(p);
  }
  void upload(const Graph& g, ValueId id, const std::vector<float>& values) const {
    const Value& v = g.value(id);
    std::vector<uint8_t> bytes(values.size() * dtype_size(v.dtype));
    if (v.dtype == DType::f32)
      std::copy_n(reinterpret_cast<const uint8_t*>(values.data()), bytes.size(), bytes.begin());
    else
      narrow(values.data(), bytes.data(), v.dtype, int64_t(values.size()));
    check_cuda(cudaMemcpy(pointers[size_t(id)], bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> download(const Graph& g, ValueId id) const {
    const Value& v = g.value(id);
    const int64_t n = v.shape.numel();
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(v.dtype));
    check_cuda(cudaMemcpy(bytes.data(), pointers[size_t(id)], bytes.size(), cudaMemcpyDeviceToHost), "download");
    std::vector<float> out(static_cast<size_t>(n));
    if (v.dtype == DType::f32)
      std::copy_n(bytes.data(), bytes.size(), reinterpret_cast<uint8_t*>(out.data()));
    else
      widen(bytes.data(), v.dtype, out.data(), n);
    return out;
  }
};

std::vector<float> rounded_random(int64_t n, DType type, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  narrow(v.data(), bits.data(), type, n);  // the values both paths see: 16-bit ones
  widen(bits.data(), type, v.data(), n);
  return v;
}

// Largest |a - b| over largest |b|, over the elements of columns [from, to) of rows `width` wide.
double relative_error(const std::vector<float>& a, const std::vector<float>& b, int64_t width, int64_t from,
                      int64_t to) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t col = int64_t(i) % width;
    if (col < from || col >= to) continue;
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

struct Outputs {
  std::vector<float> out, lse, dqkv;
};

// One forward and backward through engine::cuda::attention / attention_backward: cuDNN for a
// graph in 16 bits, the engine's fp32 kernels for the f32 graph. `dqkv_before`: when not empty,
// the backward accumulates into it.
Outputs run(const SdpaProblem& p, DType type, const std::vector<float>& qkv, const std::vector<float>& dout,
            const std::vector<float>& dqkv_before, int repeats = 1, std::vector<float>* second = nullptr) {
  AttentionGraph a = attention_graph(p, type);
  const bool accumulate = !dqkv_before.empty();
  a.backward.accumulate = accumulate;
  DeviceValues values(a.graph);
  values.upload(a.graph, a.qkv, qkv);
  values.upload(a.graph, a.dout, dout);
  int64_t workspace = int64_t(sizeof(float)) * p.batch * p.heads * p.time;  // the fp32 backward's delta
  if (type != DType::f32) {
    EXPECT_TRUE(cuda::cudnn_attention_supports(a.graph, a.forward));
    workspace = std::max({workspace, cuda::cudnn_attention_workspace(a.graph, a.forward),
                          cuda::cudnn_attention_workspace(a.graph, a.backward)});
    std::cout << name(p) << ": cuDNN workspace forward " << cuda::cudnn_attention_workspace(a.graph, a.forward)
              << ", backward " << cuda::cudnn_attention_workspace(a.graph, a.backward) << " bytes\n";
  }
  void* scratch = nullptr;
  check_cuda(cudaMalloc(&scratch, size_t(workspace)), "cudaMalloc workspace");
  KernelContext ctx;
  ctx.graph = &a.graph;
  ctx.device = Device{Device::Kind::cuda, 0};
  ctx.workspace = scratch;
  ctx.workspace_bytes = size_t(workspace);
  ctx.pointers = values.pointers;
  Outputs r;
  try {
    cuda::attention(a.forward, ctx);
    for (int i = 0; i < repeats; ++i) {
      if (accumulate) values.upload(a.graph, a.dqkv, dqkv_before);
      cuda::attention_backward(a.backward, ctx);
      check_cuda(cudaDeviceSynchronize(), "attention");
      if (i == 1 && second) *second = values.download(a.graph, a.dqkv);
      if (i == 0) r.dqkv = values.download(a.graph, a.dqkv);
    }
  } catch (...) {
    cudaFree(scratch);
    throw;
  }
  cudaFree(scratch);
  r.out = values.download(a.graph, a.out);
  r.lse = values.download(a.graph, a.lse);
  return r;
}

struct GpuCase {
  SdpaProblem p;
  bool accumulate = false;
};

class CudnnAttentionGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudnnAttentionGpu, MatchesTheFp32KernelWithin16BitTolerance) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: runs on a GPU machine";
  const GpuCase c = GetParam();
  const SdpaProblem& p = c.p;
  const int64_t row = (p.heads + 2 * p.kv_heads) * p.head_size, hd = p.head_size;
  std::mt19937 rng(7);
  const auto qkv = rounded_random(p.batch * p.time * row, p.type, rng, 1.0f);
  const auto dout = rounded_random(p.batch * p.time * p.heads * hd, p.type, rng, 1.0f);
  const auto before = c.accumulate ? rounded_random(p.batch * p.time * row, p.type, rng, 0.1f) : std::vector<float>{};
  std::vector<float> again;
  const Outputs fast = run(p, p.type, qkv, dout, before, 2, &again);
  const Outputs reference = run(p, DType::f32, qkv, dout, before);
  // bf16 keeps 8 significant bits, fp16 11: cuDNN rounds P to 16 bits for its products and its
  // outputs once; the engine's fp32 kernel rounds nothing.
  const double tolerance = p.type == DType::bf16 ? 2e-2 : 4e-3;
  const double out_error = relative_error(fast.out, reference.out, p.heads * hd, 0, p.heads * hd);
  double lse_error = 0;
  for (size_t i = 0; i < fast.lse.size(); ++i)
    lse_error = std::max(lse_error, double(std::fabs(fast.lse[i] - reference.lse[i])));
  const int64_t k0 = p.heads * hd, v0 = (p.heads + p.kv_heads) * hd;
  const double dq = relative_error(fast.dqkv, reference.dqkv, row, 0, k0);
  const double dk = relative_error(fast.dqkv, reference.dqkv, row, k0, v0);
  const double dv = relative_error(fast.dqkv, reference.dqkv, row, v0, row);
  std::cout << name(p) << (c.accumulate ? " accumulating" : "") << ": out " << out_error << ", lse " << lse_error
            << ", dq " << dq << ", dk " << dk << ", dv " << dv << " (tolerance " << tolerance << ")\n";
  EXPECT_LT(out_error, tolerance);
  EXPECT_LT(lse_error, 1e-3);  // fp32 stats from the same 16-bit inputs
  EXPECT_LT(dq, 2 * tolerance);
  EXPECT_LT(dk, 2 * tolerance);
  EXPECT_LT(dv, 2 * tolerance);
  if (p.deterministic) {
    EXPECT_TRUE(again == fast.dqkv) << "the deterministic backward gave different bits on a second run";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnAttentionGpu,
    ::testing::Values(
        GpuCase{{.batch = 4, .time = 1024, .heads = 12, .kv_heads = 12, .head_size = 64, .type = DType::bf16}},
        GpuCase{{.batch = 4, .time = 1024, .heads = 12, .kv_heads = 4, .head_size = 64, .type = DType::bf16}},
        GpuCase{{.batch = 4,
                 .time = 1024,
                 .heads = 12,
                 .kv_heads = 12,
                 .head_size = 64,
                 .type = DType::bf16,
                 .deterministic = false}},
        GpuCase{{.batch = 2, .time = 200, .heads = 12, .kv_heads = 4, .head_size = 64, .type = DType::f16}},
        GpuCase{{.batch = 2, .time = 77, .heads = 4, .kv_heads = 2, .head_size = 128, .type = DType::bf16}},
        GpuCase{{.batch = 2, .time = 130, .heads = 4, .kv_heads = 1, .head_size = 32, .type = DType::bf16}, true}),
    [](const auto& test) {
      const GpuCase& c = test.param;
      return std::string(dtype_name(c.p.type)) + "_T" + std::to_string(c.p.time) + "_H" + std::to_string(c.p.heads) +
             "_KV" + std::to_string(c.p.kv_heads) + "_hd" + std::to_string(c.p.head_size) +
             (c.accumulate ? "_accumulate" : "") + (c.p.deterministic ? "" : "_unordered");
    });

#endif

}  // namespace
}  // namespace engine
