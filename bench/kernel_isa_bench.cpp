// Times the engine's own CPU kernels that run at two vector widths (core/cpu_isa.h) on each path
// this machine has, on the benchmark GPT's shapes (bench/gpt-bench.yaml: batch 8, context 256,
// 6 heads of 64, vocabulary 50257): causal attention forward and backward, the fc layer's weight
// and bias gradients, a layernorm forward and backward, and softmax cross-entropy, in fp32 and
// bf16. Then GELU over the fc layer's 3.1M outputs, forward and backward, through oneDNN and
// through the engine's own loop (nn/gelu_onednn.h picks one per ISA from these figures).
// Threads: OMP_NUM_THREADS. Each figure is the median of
// --repeats runs; both paths give the same bits (tests/ops/kernel_isa_test.cpp).
//
//   OMP_NUM_THREADS=2 build/kernel_isa_bench [--repeats 7] [--attention (all but cross-entropy)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"
#include "loss/cross_entropy.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/gelu_onednn.h"
#include "nn/layernorm.h"
#include "random_values.h"

namespace {

using namespace engine;

double median_ms(int repeats, const std::function<void()>& run) {
  run();  // warm-up: first touch, oneDNN primitive creation
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
  bool attention_only = false;
  for (int i = 1; i < argc; ++i) attention_only = attention_only || std::string(argv[i]) == "--attention";
  const int64_t B = 8, T = 256, H = 6, hd = 64, vocab = 50257;
  std::vector<CpuIsa> paths{CpuIsa::avx2};
  if (kernel_isa() == CpuIsa::avx512) paths.push_back(CpuIsa::avx512);
  std::printf("%-28s %-6s %-7s %9s\n", "kernel", "type", "path", "ms");
  for (DType type : {DType::f32, DType::bf16}) {
    Graph g;
    ValueId qkv = g.add_activation("qkv", Shape{B, T, 3 * H * hd}, type);
    ValueId out = g.add_activation("out", Shape{B, T, H * hd}, type);
    ValueId lse = g.add_activation("lse", Shape{B, H, T}, DType::f32);
    ValueId dout = g.add_activation("dout", Shape{B, T, H * hd}, type);
    ValueId dqkv = g.add_activation("dqkv", Shape{B, T, 3 * H * hd}, type);
    ValueId logits = g.add_activation("logits", Shape{B * T, vocab}, type);
    ValueId targets = g.add_activation("targets", Shape{B * T}, DType::i32);
    ValueId losses = g.add_activation("losses", Shape{B * T}, DType::f32);
    const Node forward{&ops::kCausalAttention, {qkv}, {out, lse}, Attrs{{H, H}, {}}, false, false, "a"};
    const Node backward{
        &ops::kCausalAttentionBackward, {dout, qkv, out, lse}, {dqkv}, Attrs{{H, H}, {}}, false, false, "a"};
    // The fc layer's weight and bias gradients (2048 x 1536 outputs from 384 inputs); the bias
    // gradient's column sums are the part that runs at two widths.
    ValueId dy = g.add_activation("dy", Shape{B * T, 4 * H * hd}, type);
    ValueId x = g.add_activation("x", Shape{B * T, H * hd}, type);
    ValueId dw = g.add_activation("dw", Shape{4 * H * hd, H * hd}, DType::f32);
    ValueId db = g.add_activation("db", Shape{4 * H * hd}, DType::f32);
    const Node weight_gradient{&ops::kLinearBackwardWeight, {dy, x}, {dw, db}, {}, true, true, "fc"};
    // The bias gradient nearly alone: the same dy against an input one column wide.
    ValueId x1 = g.add_activation("x1", Shape{B * T, 1}, type);
    ValueId dw1 = g.add_activation("dw1", Shape{4 * H * hd, 1}, DType::f32);
    const Node bias_gradient{&ops::kLinearBackwardWeight, {dy, x1}, {dw1, db}, {}, true, true, "fc"};
    // A layernorm over the model's width, forward and backward.
    ValueId ln_w = g.add_activation("ln_w", Shape{H * hd}, type);
    ValueId ln_b = g.add_activation("ln_b", Shape{H * hd}, type);
    ValueId ln_y = g.add_activation("ln_y", Shape{B * T, H * hd}, type);
    ValueId ln_mean = g.add_activation("ln_mean", Shape{B * T});
    ValueId ln_rstd = g.add_activation("ln_rstd", Shape{B * T});
    ValueId ln_dw = g.add_activation("ln_dw", Shape{H * hd});
    ValueId ln_db = g.add_activation("ln_db", Shape{H * hd});
    const Attrs ln_attrs{{0, 1}, {1e-5}};
    const Node norm{&ops::kLayerNorm, {x, ln_w, ln_b}, {ln_y, ln_mean, ln_rstd}, ln_attrs, false, false, "ln"};
    const Node norm_backward{
        &ops::kLayerNormBackward, {ln_y, x, ln_w, ln_mean, ln_rstd}, {ln_y, ln_dw, ln_db}, ln_attrs, false, true, "ln"};
    const Node loss{&ops::kSoftmaxCrossEntropy,
                    {logits, targets},
                    {losses},
                    Attrs{{}, {1.0 / double(B * T)}},
                    false,
                    false,
                    "loss"};
    // GELU over the fc layer's outputs, and its gradient.
    ValueId fc_gelu = g.add_activation("fc_gelu", Shape{B * T, 4 * H * hd}, type);
    ValueId fc_dx = g.add_activation("fc_dx", Shape{B * T, 4 * H * hd}, type);
    const Node gelu{&ops::kGelu, {dy}, {fc_gelu}, {}, false, false, "gelu"};
    const Node gelu_backward{&ops::kGeluBackward, {dy, fc_gelu}, {fc_dx}, {}, false, true, "gelu"};
    test_util::RandomValues values(g, 5, vocab);  // as the op tests fill them
    const KernelContext& ctx = values.ctx;
    for (CpuIsa isa : paths) {
      ScopedKernelIsa scoped(isa);
      const std::string type_name(dtype_name(type));
      std::printf("%-28s %-6s %-7s %9.2f\n", "causal_attention", type_name.c_str(), cpu_isa_name(isa),
                  median_ms(repeats, [&] { forward.op->cpu(forward, ctx); }));
      std::printf("%-28s %-6s %-7s %9.2f\n", "causal_attention_backward", type_name.c_str(), cpu_isa_name(isa),
                  median_ms(repeats, [&] { backward.op->cpu(backward, ctx); }));
      // The kernel overwrites the logits with their gradient, whose values stay finite and small:
      // later runs time the same work.
      // Without a 16-bit matmul the executor hands the linear widened fp32 copies: nothing to time.
      if (type == DType::f32 || ops::matmul_16bit_available(type))
        std::printf("%-28s %-6s %-7s %9.2f\n", "linear_backward_weight+bias", type_name.c_str(), cpu_isa_name(isa),
                    median_ms(repeats, [&] { weight_gradient.op->cpu(weight_gradient, ctx); }));
      if (type == DType::f32 || ops::matmul_16bit_available(type))
        std::printf("%-28s %-6s %-7s %9.2f\n", "bias gradient (x 1 wide)", type_name.c_str(), cpu_isa_name(isa),
                    median_ms(repeats, [&] { bias_gradient.op->cpu(bias_gradient, ctx); }));
      std::printf("%-28s %-6s %-7s %9.2f\n", "layernorm", type_name.c_str(), cpu_isa_name(isa),
                  median_ms(repeats, [&] { norm.op->cpu(norm, ctx); }));
      std::printf("%-28s %-6s %-7s %9.2f\n", "layernorm_backward", type_name.c_str(), cpu_isa_name(isa),
                  median_ms(repeats, [&] { norm_backward.op->cpu(norm_backward, ctx); }));
      if (!attention_only)
        std::printf("%-28s %-6s %-7s %9.2f\n", "softmax_cross_entropy", type_name.c_str(), cpu_isa_name(isa),
                    median_ms(repeats, [&] { loss.op->cpu(loss, ctx); }));
    }
    const std::string type_name(dtype_name(type));
    for (auto [path, name] : {std::pair{ops::GeluPath::onednn, "oneDNN"}, std::pair{ops::GeluPath::engine, "engine"}}) {
      if (path == ops::GeluPath::onednn && !ops::onednn_gelu_available(type, B * T * 4 * H * hd)) continue;
      ops::set_gelu_path(path);
      std::printf("%-28s %-6s %-7s %9.2f\n", "gelu", type_name.c_str(), name,
                  median_ms(repeats, [&] { gelu.op->cpu(gelu, ctx); }));
      std::printf("%-28s %-6s %-7s %9.2f\n", "gelu_backward", type_name.c_str(), name,
                  median_ms(repeats, [&] { gelu_backward.op->cpu(gelu_backward, ctx); }));
    }
    ops::set_gelu_path(ops::GeluPath::automatic);
  }
  return 0;
}
