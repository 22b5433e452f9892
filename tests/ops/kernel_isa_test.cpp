// The kernels the engine compiles at two vector widths (core/cpu_isa.h) give the same bits at both,
// so a run on an AVX-512 machine and one on an AVX2 machine differ only where oneDNN's kernels do:
// cross-entropy (rows of several chunks and a ragged tail, in fp32 and 16-bit storage), the norms,
// a linear layer's bias gradient and the bf16 conversions (ties, infinities, NaN, subnormals). On a CPU without AVX-512
// they skip and say so.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"
#include "loss/cross_entropy.h"
#include "nn/layernorm.h"
#include "random_values.h"

namespace engine {
namespace {

void require_avx512() {
  if (kernel_isa() != CpuIsa::avx512) GTEST_SKIP() << "this CPU has no AVX-512: only the AVX2 kernels run here";
}

// Losses and logit gradients of one cross-entropy over `rows` rows of `vocab` logits.
std::vector<char> run_cross_entropy(DType type, int64_t rows, int64_t vocab, CpuIsa isa) {
  const ScopedKernelIsa scoped_isa(isa);
  Graph g;
  const ValueId logits = g.add_activation("logits", Shape{rows, vocab}, type);
  const ValueId targets = g.add_activation("targets", Shape{rows}, DType::i32);
  const ValueId losses = g.add_activation("losses", Shape{rows});
  const Node node{&ops::kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {0.25}}, false, false, "loss"};
  test_util::RandomValues values(g, 11, vocab);
  node.op->cpu(node, values.ctx);
  std::vector<char> result = values.bytes(losses);
  result.insert(result.end(), values.bytes(logits).begin(), values.bytes(logits).end());
  return result;
}

TEST(KernelIsa, CrossEntropyGivesTheSameBitsAtEveryWidth) {
  require_avx512();
  // 1100 logits: three 512-logit chunks, the last of 76 (not a multiple of 16); 4 rows.
  for (DType type : {DType::f32, DType::bf16, DType::f16})
    for (int64_t vocab : {int64_t(7), int64_t(1100)})
      EXPECT_TRUE(run_cross_entropy(type, 4, vocab, CpuIsa::avx2) == run_cross_entropy(type, 4, vocab, CpuIsa::avx512))
          << dtype_name(type) << ", vocabulary " << vocab;
}

// The weight and bias gradients of a linear layer (the bias gradient's column sums run at two widths).
std::vector<char> run_bias_gradient(DType type, CpuIsa isa) {
  const ScopedKernelIsa scoped_isa(isa);
  const int64_t rows = 70, out = 150, in = 9;  // 16-lane blocks and a ragged tail
  Graph g;
  const ValueId dy = g.add_activation("dy", Shape{rows, out}, type);
  const ValueId x = g.add_activation("x", Shape{rows, in}, type);
  const ValueId dw = g.add_activation("dw", Shape{out, in});
  const ValueId db = g.add_activation("db", Shape{out});
  const Node node{&ops::kLinearBackwardWeight, {dy, x}, {dw, db}, {}, true, true, "fc"};
  test_util::RandomValues values(g, 3);
  node.op->cpu(node, values.ctx);
  std::vector<char> result = values.bytes(db);
  result.insert(result.end(), values.bytes(dw).begin(), values.bytes(dw).end());
  return result;
}

TEST(KernelIsa, BiasGradientGivesTheSameBitsAtEveryWidth) {
  require_avx512();
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    if (type != DType::f32 && !ops::matmul_16bit_available(type)) continue;  // the op needs one in 16 bits
    EXPECT_TRUE(run_bias_gradient(type, CpuIsa::avx2) == run_bias_gradient(type, CpuIsa::avx512)) << dtype_name(type);
  }
}

// A layernorm (or rmsnorm) forward and backward over rows of 150 (nine 16-lane blocks and a ragged
// tail), in 40 rows (two 32-row blocks of the scale and shift gradients).
std::vector<char> run_norm(DType type, bool rms, CpuIsa isa) {
  const ScopedKernelIsa scoped_isa(isa);
  const int64_t rows = 40, c = 150;
  Graph g;
  const ValueId x = g.add_activation("x", Shape{rows, c}, type);
  const ValueId w = g.add_activation("w", Shape{c}, type);
  const ValueId b = g.add_activation("b", Shape{c}, type);
  const ValueId y = g.add_activation("y", Shape{rows, c}, type);
  const ValueId mean = g.add_activation("mean", Shape{rows});
  const ValueId rstd = g.add_activation("rstd", Shape{rows});
  const ValueId dy = g.add_activation("dy", Shape{rows, c}, type);
  const ValueId dx = g.add_activation("dx", Shape{rows, c}, type);
  const ValueId dw = g.add_activation("dw", Shape{c});
  const ValueId db = g.add_activation("db", Shape{c});
  const Attrs attrs{{rms ? 1 : 0, rms ? 0 : 1}, {1e-5}};
  const std::vector<ValueId> params = rms ? std::vector<ValueId>{x, w} : std::vector<ValueId>{x, w, b};
  const Node forward{rms ? &ops::kRmsNorm : &ops::kLayerNorm, params, {y, mean, rstd}, attrs, false, false, "ln"};
  std::vector<ValueId> grads{dx, dw};
  if (!rms) grads.push_back(db);
  const Node backward{rms ? &ops::kRmsNormBackward : &ops::kLayerNormBackward,
                      {dy, x, w, mean, rstd},
                      grads,
                      attrs,
                      true,  // accumulate into dx's random start
                      true,
                      "ln"};
  test_util::RandomValues values(g, 7);
  forward.op->cpu(forward, values.ctx);
  backward.op->cpu(backward, values.ctx);
  std::vector<char> result;
  for (ValueId id : {y, mean, rstd, dx, dw, db})
    result.insert(result.end(), values.bytes(id).begin(), values.bytes(id).end());
  return result;
}

TEST(KernelIsa, NormsGiveTheSameBitsAtEveryWidth) {
  require_avx512();
  for (DType type : {DType::f32, DType::bf16, DType::f16})
    for (bool rms : {false, true})
      EXPECT_TRUE(run_norm(type, rms, CpuIsa::avx2) == run_norm(type, rms, CpuIsa::avx512))
          << dtype_name(type) << (rms ? " rmsnorm" : " layernorm");
}

TEST(KernelIsa, Bf16ConversionsGiveTheSameBitsAtEveryWidth) {
  require_avx512();
  std::vector<float> floats;
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u, 0x007fffffu, 0x80000001u, 0x7f7fffffu,
                        0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x00000000u, 0x80000000u})
    floats.push_back(std::bit_cast<float>(bits));
  for (int i = 0; i < 1000; ++i) floats.push_back(std::ldexp(float(i % 97) - 48.5f, i % 60 - 30));
  const int64_t n = int64_t(floats.size());
  std::vector<uint16_t> narrow_avx2(floats.size()), narrow_avx512(floats.size());
  std::vector<float> widen_avx2(floats.size(), 1.5f), widen_avx512(floats.size(), 1.5f);
  {
    const ScopedKernelIsa scoped_isa(CpuIsa::avx2);
    narrow_serial(floats.data(), narrow_avx2.data(), DType::bf16, n);
    widen_serial(narrow_avx2.data(), DType::bf16, widen_avx2.data(), n, /*accumulate=*/true);
  }
  {
    const ScopedKernelIsa scoped_isa(CpuIsa::avx512);
    narrow_serial(floats.data(), narrow_avx512.data(), DType::bf16, n);
    widen_serial(narrow_avx512.data(), DType::bf16, widen_avx512.data(), n, /*accumulate=*/true);
  }
  EXPECT_TRUE(narrow_avx2 == narrow_avx512);
  EXPECT_EQ(0, std::memcmp(widen_avx2.data(), widen_avx512.data(), floats.size() * sizeof(float)));
}

TEST(KernelIsa, OneDnnIsaCapAlsoCapsTheEnginesKernels) {
  EXPECT_FALSE(max_cpu_isa_allows_avx512("AVX2"));
  EXPECT_FALSE(max_cpu_isa_allows_avx512("avx2_vnni_2"));
  EXPECT_FALSE(max_cpu_isa_allows_avx512("SSE41"));
  EXPECT_TRUE(max_cpu_isa_allows_avx512("AVX512_CORE_BF16"));
  EXPECT_TRUE(max_cpu_isa_allows_avx512("avx512_core_amx"));
  EXPECT_TRUE(max_cpu_isa_allows_avx512("AVX10_1_512"));
  EXPECT_TRUE(max_cpu_isa_allows_avx512("ALL"));
}

TEST(KernelIsa, ScopedIsaNeverExceedsTheCpu) {
  const CpuIsa machine = kernel_isa();
  {
    const ScopedKernelIsa scoped_isa(CpuIsa::avx2);
    EXPECT_EQ(kernel_isa(), CpuIsa::avx2);
    const ScopedKernelIsa inner(CpuIsa::avx512);
    EXPECT_EQ(kernel_isa(), machine);
  }
  EXPECT_EQ(kernel_isa(), machine);
}

}  // namespace
}  // namespace engine
