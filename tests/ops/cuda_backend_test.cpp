// The op harness's backend mode (op_harness.h, run_case_against_cpu): every case's forward output
// and parameter gradients on CUDA device 0 against the CPU's, from the same parameters and inputs,
// in f32, bf16 and fp16 storage, on a few random shape draws (odd sizes included). Each case prints
// its worst relative errors and how many elements differ in their bits.
//
// CudaBackend needs a CUDA device (ctest label "cuda"); it skips without one. CudaHarness runs the
// same comparison CPU against CPU, everywhere (label "ops"): the harness's own check, which must
// find every element bit-equal.
#include <gtest/gtest.h>

#include <exception>
#include <iostream>
#include <random>
#include <string>
#include <tuple>

#include "core/build_flags.h"
#include "core/device_info.h"
#include "linalg/gemm16.h"
#include "linalg/linear_gelu.h"
#include "op_harness.h"

namespace engine::op_harness {
namespace {

std::string storage_name(DType storage) { return std::string(dtype_name(storage)); }

class CudaBackend : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(CudaBackend, EveryOpMatchesTheCpu) {
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << (kHaveCuda ? "the runtime reports none" : "this build has no CUDA")
                 << "; run on a GPU machine with a build configured with ENGINE_CUDA=ON";
  const auto [seed, storage] = GetParam();
  if (seed == 1 && storage == DType::f32) std::cout << "device 0: " << cuda_device_name(0) << "\n";
  std::mt19937 shape_rng{static_cast<uint32_t>(seed)};
  int64_t compared = 0, bits_differ = 0, bit_equal_cases = 0, ran = 0;
  double worst_forward = 0, worst_backward = 0;
  std::vector<Case> all = cases(shape_rng);
  for (Case& c : fusion_cases(shape_rng)) all.push_back(std::move(c));
  for (const Case& c : all) {
    DeviceComparison result;
    try {
      result = run_case_against_cpu(c, uint64_t(seed) + 11, {.storage = storage});
    } catch (const std::exception& e) {  // one case's error, and the other cases still run
      ADD_FAILURE() << c.name << " [" << storage_name(storage) << "]: " << e.what();
      continue;
    }
    ++ran;
    compared += result.compared;
    bits_differ += result.bits_differ;
    bit_equal_cases += result.bits_differ == 0;
    worst_forward = std::max(worst_forward, result.worst_forward);
    worst_backward = std::max(worst_backward, result.worst_backward);
  }
  const cuda::GeluProducts gelu = cuda::gelu_products();
  std::cout << "GELU products so far: " << gelu.fused << " in cuBLASLt's epilogue, " << gelu.composed
            << " as the product and the GELU kernel\n";
  std::cout << storage_name(storage) << " seed " << seed << ": " << ran << " cases, " << bit_equal_cases
            << " bit-equal; " << bits_differ << " of " << compared << " elements bit-different; worst forward "
            << worst_forward << ", backward " << worst_backward << "\n";
}

INSTANTIATE_TEST_SUITE_P(RandomShapes, CudaBackend,
                         ::testing::Combine(::testing::Range(1, 4),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const auto& test) {
                           return storage_name(std::get<1>(test.param)) + "_seed" +
                                  std::to_string(std::get<0>(test.param));
                         });

// The comparison itself, CPU against CPU: the same graph, store and inputs give the same bits, so
// every case runs in every storage type and the tolerances and counts are exercised without a GPU.
class CudaHarness : public ::testing::TestWithParam<DType> {};

TEST_P(CudaHarness, CpuAgainstCpuIsBitEqual) {
  std::mt19937 shape_rng{1};
  for (const Case& c : cases(shape_rng)) {
    DeviceComparison result;
    try {
      result = run_case_against_cpu(c, 12, {.storage = GetParam()}, Device{});
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": " << e.what();
      continue;
    }
    EXPECT_GT(result.compared, 0) << c.name;
    EXPECT_EQ(result.bits_differ, 0) << c.name << ": two CPU runs of the same step differ";
    EXPECT_EQ(result.worst_forward, 0) << c.name;
    EXPECT_EQ(result.worst_backward, 0) << c.name;
  }
}

// The fused sequences, fused on the second CPU run: the fused ops' CPU kernels run the unfused
// kernels in turn, so they give the unfused graph's bits wherever the products take the 16-bit
// values as they are (f32, and 16-bit types this CPU's matmul computes natively; elsewhere the
// executor widens the fused node's values, and its GELU reads the product before it is rounded).
TEST_P(CudaHarness, FusedCpuKernelsGiveTheUnfusedBits) {
  const DType storage = GetParam();
  std::mt19937 shape_rng{1};
  for (const Case& c : fusion_cases(shape_rng)) {
    const DeviceComparison result = run_case_against_cpu(c, 12, {.storage = storage}, Device{});
    EXPECT_EQ(result.fused, c.fused_nodes) << c.name << ": the sequence fused";
    EXPECT_GT(result.compared, 0) << c.name;
    if (storage == DType::f32 || ops::matmul_16bit_available(storage)) {
      EXPECT_EQ(result.bits_differ, 0) << c.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaHarness, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& test) { return storage_name(test.param); });

}  // namespace
}  // namespace engine::op_harness
