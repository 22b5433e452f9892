// causal_attention's kernels run blocks of queries on many threads: their results must not depend
// on how many there are (training is bitwise reproducible on one machine whatever OMP_NUM_THREADS
// says), in fp32 and in 16-bit storage, with grouped-query heads and accumulating gradients; nor on
// the vector width their row loops run at.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "linalg/gemm16.h"
#include "nn/attention.h"
#include "nn/attention16.h"
#include "random_values.h"

namespace engine {
namespace {

// One forward and one backward of attention on fixed random values with `threads` threads and the
// kernels at `isa`; returns the bytes of out, lse and dqkv.
std::vector<char> run_attention(DType type, int threads, CpuIsa isa = kernel_isa(), bool matmul16 = true) {
  const ScopedKernelIsa scoped_isa(isa);
  ops::set_attention16_enabled(matmul16);
  const int64_t B = 2, T = 150, H = 4, KV = 2, hd = 8;  // T spans three query blocks, the last partial
  Graph g;
  ValueId qkv = g.add_activation("qkv", Shape{B, T, (H + 2 * KV) * hd}, type);
  ValueId out = g.add_activation("out", Shape{B, T, H * hd}, type);
  ValueId lse = g.add_activation("lse", Shape{B, H, T}, DType::f32);
  ValueId dout = g.add_activation("dout", Shape{B, T, H * hd}, type);
  ValueId dqkv = g.add_activation("dqkv", Shape{B, T, (H + 2 * KV) * hd}, type);
  const Node forward{&ops::kCausalAttention, {qkv}, {out, lse}, Attrs{{H, KV}, {}}, false, false, "a"};
  const Node backward{&ops::kCausalAttentionBackward,
                      {dout, qkv, out, lse},
                      {dqkv},
                      Attrs{{H, KV}, {}},
                      true,  // accumulate into dqkv's random start
                      false,
                      "a"};
  test_util::RandomValues values(g, 5);
  const KernelContext& ctx = values.ctx;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  forward.op->cpu(forward, ctx);
  backward.op->cpu(backward, ctx);
  omp_set_num_threads(before);
  ops::set_attention16_enabled(true);
  std::vector<char> result;
  for (ValueId id : {out, lse, dqkv}) result.insert(result.end(), values.bytes(id).begin(), values.bytes(id).end());
  return result;
}

TEST(CausalAttention, ResultsDoNotDependOnTheNumberOfThreads) {
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<char> one = run_attention(type, 1);
    for (int threads : {2, 3, 5})
      EXPECT_TRUE(one == run_attention(type, threads)) << dtype_name(type) << ", " << threads << " threads";
  }
}

// The row loops run at AVX2 or AVX-512 (core/cpu_isa.h) with the same bits, so a run does not
// depend on which of the two a machine has.
TEST(CausalAttention, ResultsDoNotDependOnTheVectorWidth) {
  if (kernel_isa() != CpuIsa::avx512) GTEST_SKIP() << "this CPU has no AVX-512: only the AVX2 kernels run here";
  for (DType type : {DType::f32, DType::bf16, DType::f16})
    EXPECT_TRUE(run_attention(type, 2, CpuIsa::avx2) == run_attention(type, 2, CpuIsa::avx512)) << dtype_name(type);
}

// In 16-bit storage the products read P and dS rounded to the stored type, whether they are 16-bit
// matmuls or fp32 GEMMs on widened tiles: the two paths differ only in the GEMMs' summation order,
// so out and dqkv (rounded to bf16) agree to one bf16 step, few of them differ at all, and the fp32
// lse agrees to float rounding. A widened path that kept P (or dS) in fp32 changes 9% (12%) of the
// bf16 results.
TEST(CausalAttention, SixteenBitMatmulsComputeWhatTheWidenedPathComputes) {
  if (!ops::matmul_16bit_available(DType::bf16)) GTEST_SKIP() << "no 16-bit matmul on this CPU: one path only";
  const std::vector<char> matmul = run_attention(DType::bf16, 2, kernel_isa(), true);
  const std::vector<char> widened = run_attention(DType::bf16, 2, kernel_isa(), false);
  ASSERT_EQ(matmul.size(), widened.size());
  // The layout run_attention returns: out (bf16), lse (fp32), dqkv (bf16).
  const size_t out_bytes = 2 * 150 * 4 * 8 * 2, lse_bytes = 2 * 4 * 150 * 4;
  size_t differing = 0, elements = 0;
  double worst_lse = 0, worst_bf16 = 0;
  for (size_t at = 0; at < matmul.size();) {
    const bool lse = at >= out_bytes && at < out_bytes + lse_bytes;
    if (lse) {
      float a, b;
      std::memcpy(&a, &matmul[at], 4);
      std::memcpy(&b, &widened[at], 4);
      worst_lse = std::max(worst_lse, double(std::abs(a - b)) / (1 + std::abs(double(b))));
      at += 4;
      continue;
    }
    uint16_t a16, b16;
    std::memcpy(&a16, &matmul[at], 2);
    std::memcpy(&b16, &widened[at], 2);
    float a, b;
    widen_serial(&a16, DType::bf16, &a, 1);
    widen_serial(&b16, DType::bf16, &b, 1);
    ++elements;
    differing += a16 != b16;
    worst_bf16 = std::max(worst_bf16, double(std::abs(a - b)) / (1e-3 + std::abs(double(b))));
    at += 2;
  }
  EXPECT_LE(worst_lse, 1e-6);
  EXPECT_LE(worst_bf16, 1.0 / 128) << "more than one bf16 step apart";
  EXPECT_LE(differing, elements / 20) << differing << " of " << elements << " bf16 results differ";
}

}  // namespace
}  // namespace engine
