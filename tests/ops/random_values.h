// Memory for every value of a graph, filled from a seeded normal distribution (i32 values: indices
// below `index_range`), and the kernel context over it: for tests that run one op's kernel directly.
//
//   RandomValues values(g, /*seed=*/5);
//   node.op->cpu(node, values.ctx);
//   std::vector<char> out = values.bytes(out_id);
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/convert.h"
#include "graph/graph.h"
#include "graph/op.h"

namespace engine::test_util {

struct RandomValues {
  std::vector<std::vector<char>> memory;
  KernelContext ctx;

  RandomValues(const Graph& g, uint32_t seed, int64_t index_range = 1) {
    ctx.graph = &g;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (const Value& v : g.values()) {
      memory.emplace_back(size_t(v.shape.numel()) * dtype_size(v.dtype));
      if (v.dtype == DType::i32) {
        auto* indices = reinterpret_cast<int32_t*>(memory.back().data());
        for (int64_t i = 0; i < v.shape.numel(); ++i) indices[i] = int32_t(rng() % uint32_t(index_range));
      } else {
        std::vector<float> values(size_t(v.shape.numel()));
        for (float& x : values) x = normal(rng);
        narrow(values.data(), memory.back().data(), v.dtype, v.shape.numel());
      }
      ctx.pointers.push_back(memory.back().data());
      ctx.dtypes.push_back(v.dtype);
    }
  }

  const std::vector<char>& bytes(ValueId id) const { return memory[size_t(id)]; }
};

}  // namespace engine::test_util
