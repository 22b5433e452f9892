// The op harness in bf16 and fp16 storage (op_harness.h): the ops with a 16-bit path, through the
// precision pass as the engine's step runs them, against the double reference of the rounded
// inputs.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <tuple>

#include "op_harness.h"

namespace engine::op_harness {
namespace {

// The ops with a 16-bit path: elementwise chunks (activations, add, swiglu), widened rows (the
// norms, the embedding, rotary), cross-entropy, the linear layer (oneDNN's 16-bit matmul where this CPU has one),
// reshape (a copy in the stored type) and causal attention (fp32 GEMMs on widened tiles).
// The value says whether the parameters' gradient is rounded to the storage type on its way.
const std::map<std::string, bool> kSixteenBit{{"linear+bias", false},
                                              {"linear+bias (wide)", false},
                                              {"linear (3-D input, no bias)", false},
                                              {"layernorm", false},
                                              {"layernorm without shift", false},
                                              {"rmsnorm", false},
                                              {"gelu", false},
                                              {"relu", false},
                                              {"silu", false},
                                              {"swiglu", false},
                                              {"add", false},
                                              {"layernorm (wide)", false},
                                              {"gelu (wide)", false},
                                              {"add (wide)", false},
                                              {"embedding with positions", false},
                                              {"rotary", false},
                                              {"rotary (grouped-query, llama3 scaling)", false},
                                              {"softmax_cross_entropy", true},
                                              {"softmax_cross_entropy (long rows)", true},
                                              {"reshape", false},
                                              {"causal_attention", false},
                                              {"causal_attention (grouped-query)", false},
                                              {"causal_attention (grouped-query, over query blocks)", false},
                                              {"causal_attention of an activation", true}};

class OpHarness16 : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(OpHarness16, SixteenBitStorageMatchesDoubleReferenceOfTheRoundedInputs) {
  const auto [seed, storage] = GetParam();
  std::mt19937 shape_rng{static_cast<uint32_t>(seed)};
  size_t ran = 0;
  for (const Case& c : cases(shape_rng)) {
    auto it = kSixteenBit.find(c.name);
    if (it == kSixteenBit.end()) continue;
    ++ran;
    // The first seed names the path each node took (the linear one depends on this oneDNN and CPU).
    run_case(
        c, uint64_t(seed) + 11,
        {.storage = storage, .rounded_gradient = it->second, .print_path = seed == 1 && c.name.starts_with("linear+")});
  }
  EXPECT_EQ(ran, kSixteenBit.size()) << "a 16-bit case lost its op";
}

INSTANTIATE_TEST_SUITE_P(RandomShapes, OpHarness16,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& test) {
                           return std::string(dtype_name(std::get<1>(test.param))) + "_seed" +
                                  std::to_string(std::get<0>(test.param));
                         });

}  // namespace
}  // namespace engine::op_harness
