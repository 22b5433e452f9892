// causal_attention's kernels run blocks of queries on many threads: their results must not depend
// on how many there are (training is bitwise reproducible on one machine whatever OMP_NUM_THREADS
// says), in fp32 and in 16-bit storage, with grouped-query heads and accumulating gradients.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/convert.h"
#include "nn/attention.h"

namespace engine {
namespace {

// One forward and one backward of attention on fixed random values with `threads` threads; returns
// the bytes of out, lse and dqkv.
std::vector<char> run_attention(DType type, int threads) {
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
  std::vector<std::vector<char>> memory;
  KernelContext ctx;
  ctx.graph = &g;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const Value& v : g.values()) {
    memory.emplace_back(size_t(v.shape.numel()) * dtype_size(v.dtype));
    std::vector<float> values(size_t(v.shape.numel()));
    for (float& x : values) x = normal(rng);
    narrow(values.data(), memory.back().data(), v.dtype, v.shape.numel());
    ctx.pointers.push_back(memory.back().data());
    ctx.dtypes.push_back(v.dtype);
  }
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  forward.op->cpu(forward, ctx);
  backward.op->cpu(backward, ctx);
  omp_set_num_threads(before);
  std::vector<char> result;
  for (ValueId id : {out, lse, dqkv}) result.insert(result.end(), memory[size_t(id)].begin(), memory[size_t(id)].end());
  return result;
}

TEST(CausalAttention, ResultsDoNotDependOnTheNumberOfThreads) {
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<char> one = run_attention(type, 1);
    for (int threads : {2, 3, 5})
      EXPECT_TRUE(one == run_attention(type, threads)) << dtype_name(type) << ", " << threads << " threads";
  }
}

}  // namespace
}  // namespace engine
