// 16-bit paths: the bulk conversions against the scalar ones, and oneDNN's 16-bit matmul (every
// transpose, bias, accumulation, fp32 and bf16 results) against a double-precision product of the
// same rounded operands.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/convert.h"
#include "linalg/gemm16.h"

namespace engine {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = float_to_bf16(normal(rng));
  return out;
}

// Both entry points (the parallel one splits large calls across threads, the serial one runs in a
// kernel's own parallel loop), at lengths around the vector widths and past the serial limit, with
// the values the vector rounding must get right: ties to even, overflow to infinity, subnormals,
// signed zeros, infinities and NaNs.
TEST(Convert, BulkConversionsMatchTheScalarOnesBitForBit) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1e3f);
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(1037), 3 * kSerialElements + 5}) {
    std::vector<float> values(static_cast<size_t>(n));
    for (auto& v : values) v = normal(rng);
    const float specials[] = {INFINITY,
                              -0.0f,
                              NAN,
                              1e-40f,
                              70000.0f,
                              std::bit_cast<float>(0x3f808000u),  // bf16 tie, rounds down to even
                              std::bit_cast<float>(0x3f818000u),  // bf16 tie, rounds up to even
                              std::bit_cast<float>(0x7f7fffffu),  // rounds to bf16 infinity
                              std::bit_cast<float>(0x7f800001u),  // signalling NaN
                              std::bit_cast<float>(0xffc00001u),  // negative NaN
                              -INFINITY,
                              -1e-45f};
    for (size_t i = 0; i < values.size(); ++i)
      if (i % 7 == 0) values[i] = specials[(i / 7) % std::size(specials)];
    for (DType type : {DType::bf16, DType::f16})
      for (bool serial : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + (serial ? " serial" : " parallel") + " n=" + std::to_string(n));
        std::vector<uint16_t> bulk(values.size());
        std::vector<float> back(values.size()), added(values.size(), 1.0f);
        if (serial) {
          narrow_serial(values.data(), bulk.data(), type, n);
          widen_serial(bulk.data(), type, back.data(), n);
          widen_serial(bulk.data(), type, added.data(), n, true);
        } else {
          narrow(values.data(), bulk.data(), type, n);
          widen(bulk.data(), type, back.data(), n);
          widen(bulk.data(), type, added.data(), n, true);
        }
        for (size_t i = 0; i < values.size(); ++i) {
          uint16_t scalar = type == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
          float widened = type == DType::bf16 ? bf16_to_float(scalar) : f16_to_float(scalar);
          if (std::isnan(values[i])) {
            ASSERT_TRUE(std::isnan(back[i])) << i;
            if (type == DType::bf16) {
              ASSERT_EQ(bulk[i], scalar) << i;
            }
            continue;
          }
          ASSERT_EQ(bulk[i], scalar) << i << " " << values[i];
          ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(widened)) << i;
          ASSERT_EQ(added[i], 1.0f + widened) << i;
        }
      }
  }
}

TEST(Gemm16, MatchesADoubleProductOfTheRoundedOperands) {
  if (!ops::matmul_16bit_available(DType::bf16)) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  std::mt19937 rng(7);
  const int64_t m = 37, n = 29, k = 53;
  for (bool transa : {false, true})
    for (bool transb : {false, true})
      for (bool accumulate : {false, true})
        for (DType result : {DType::f32, DType::bf16}) {
          auto a = random_bf16(size_t(m * k), rng), b = random_bf16(size_t(k * n), rng),
               bias = random_bf16(size_t(n), rng);
          const int64_t lda = transa ? m : k, ldb = transb ? k : n;
          auto at = [&](int64_t i, int64_t p) {
            return bf16_to_float(transa ? a[size_t(p * m + i)] : a[size_t(i * k + p)]);
          };
          auto bt = [&](int64_t p, int64_t j) {
            return bf16_to_float(transb ? b[size_t(j * k + p)] : b[size_t(p * n + j)]);
          };
          std::vector<float> c32(size_t(m * n), 0.5f);
          std::vector<uint16_t> c16(size_t(m * n), float_to_bf16(0.5f));
          void* c = result == DType::f32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
          ops::gemm16({transa, transb, m, n, k, lda, ldb, n, DType::bf16, result, accumulate}, a.data(), b.data(),
                      accumulate ? nullptr : bias.data(), c);
          double worst = 0;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double want = accumulate ? 0.5 : double(bf16_to_float(bias[size_t(j)]));
              for (int64_t p = 0; p < k; ++p) want += double(at(i, p)) * double(bt(p, j));
              double got = result == DType::f32 ? c32[size_t(i * n + j)] : bf16_to_float(c16[size_t(i * n + j)]);
              worst = std::max(worst, std::abs(got - want) / (1 + std::abs(want)));
            }
          // fp32 accumulation: 1e-5; a bf16 result adds its own rounding (2^-8 relative).
          EXPECT_LT(worst, result == DType::f32 ? 1e-5 : 8e-3)
              << "transa " << transa << " transb " << transb << " accumulate " << accumulate << " result "
              << dtype_name(result);
        }
}

// Attention's tiles run one shape's primitive from every thread of the team at once. Each thread
// must get the bits it gets alone: with oneDNN's own scratchpad a primitive runs in the calling
// thread's buffer, sized by the primitives that thread created, so a thread running one another
// thread made wrote past its buffer; gemm16 hands each call one of the primitive's size. Only
// kernels that ask for a scratchpad can show it (brgemm at AVX-512; none of AVX2's). The team is
// the default one (a grown team trips LeakSanitizer with LLVM's OpenMP: tests/ops/CMakeLists.txt).
// The kernel named for 16-bit products (the golden environment's, and the one the peak probe rates
// MFU against) is the one GPT-2 small's linears run, forward and backward: on an AMX CPU the AMX
// kernel, which a tiny product would not get.
TEST(Gemm16, TheNamedKernelIsTheOneTheLinearsRun) {
  for (DType type : {DType::bf16, DType::f16}) {
    if (!ops::matmul_16bit_available(type)) continue;
    const int64_t rows = 2048, width = 768;
    for (int64_t out : {3 * width, 4 * width}) {
      const ops::Gemm16 forward{false, true, rows, out, width, width, width, out, type, type, false};
      const ops::Gemm16 input_grad{false, false, rows, width, out, out, width, width, type, type, false};
      const ops::Gemm16 weight_grad{true, false, out, width, rows, out, width, width, type, DType::f32, true};
      EXPECT_EQ(ops::gemm16_kernel(forward, true), ops::matmul_16bit_kernel(type)) << dtype_name(type) << " " << out;
      EXPECT_EQ(ops::gemm16_kernel(input_grad, false), ops::matmul_16bit_kernel(type))
          << dtype_name(type) << " " << out;
      EXPECT_EQ(ops::gemm16_kernel(weight_grad, false), ops::matmul_16bit_kernel(type))
          << dtype_name(type) << " " << out;
    }
  }
}

TEST(Gemm16, OneShapeRunByEveryThreadAtOnceGivesEachThreadItsSerialResult) {
  const int threads = omp_get_max_threads();
  if (threads < 2) GTEST_SKIP() << "one OpenMP thread: nothing runs at once";
  std::vector<DType> types{DType::f32};
  if (ops::matmul_16bit_available(DType::bf16)) types.push_back(DType::bf16);
  const int repeats = 300;
  // attention's backward products: dK += dS^T Q / sqrt(hd) over a short last block, dV += P^T dO,
  // and dP = dO V^T
  const ops::Gemm16 shapes[] = {
      {.transa = true, .m = 66, .n = 4, .k = 2, .lda = 66, .ldb = 12, .ldc = 4, .accumulate = true, .scale = 0.5f},
      {.transa = true, .m = 130, .n = 16, .k = 64, .lda = 130, .ldb = 48, .ldc = 16, .accumulate = true},
      {.transb = true, .m = 64, .n = 130, .k = 16, .lda = 48, .ldb = 48, .ldc = 130}};
  std::mt19937 rng(11);
  size_t shown = 0;
  for (DType type : types)
    for (ops::Gemm16 shape : shapes) {
      shape.operands = type;
      shape.result = DType::f32;
      if (ops::gemm16_scratchpad_bytes(shape) > 0) ++shown;
      const size_t a_size = size_t((shape.transa ? shape.k : shape.m) * shape.lda);
      const size_t b_size = size_t((shape.transb ? shape.n : shape.k) * shape.ldb);
      const size_t c_size = size_t(shape.m * shape.ldc), width = type == DType::f32 ? 2 : 1;
      // Per thread: its operands (as 16-bit words; fp32 ones take two each) and its serial result.
      std::vector<std::vector<uint16_t>> a(static_cast<size_t>(threads)), b(static_cast<size_t>(threads));
      std::vector<std::vector<float>> serial(static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        a[size_t(t)] = random_bf16(a_size * width, rng);
        b[size_t(t)] = random_bf16(b_size * width, rng);
        if (type == DType::f32)  // the bf16 words' values widened into whole floats
          for (auto* words : {&a[size_t(t)], &b[size_t(t)]})
            for (size_t i = 0; i < words->size() / 2; ++i) {
              const float v = bf16_to_float((*words)[2 * i]);
              std::memcpy(words->data() + 2 * i, &v, 4);
            }
        serial[size_t(t)].assign(c_size, 0.25f);
      }
      // The serial results from one thread of the team, as a kernel's parallel loop calls gemm16
      // (inside a parallel region oneDNN runs each product on the calling thread alone).
#pragma omp parallel
#pragma omp single
      for (int t = 0; t < threads; ++t)
        ops::gemm16(shape, a[size_t(t)].data(), b[size_t(t)].data(), nullptr, serial[size_t(t)].data());
      std::vector<int> mismatches(static_cast<size_t>(threads), 0);
#pragma omp parallel
      {
        const size_t t = size_t(omp_get_thread_num());
        std::vector<float> c(c_size);
        for (int r = 0; r < repeats; ++r) {
          std::fill(c.begin(), c.end(), 0.25f);
          ops::gemm16(shape, a[t].data(), b[t].data(), nullptr, c.data());
          if (std::memcmp(c.data(), serial[t].data(), c_size * 4) != 0) ++mismatches[t];
        }
      }
      for (int t = 0; t < threads; ++t)
        EXPECT_EQ(mismatches[size_t(t)], 0)
            << "thread " << t << " of " << dtype_name(type) << " (" << shape.m << " x " << shape.n << " x " << shape.k
            << ", oneDNN " << ops::matmul_16bit_kernel(type) << ")";
    }
  if (shown == 0) GTEST_SKIP() << "oneDNN's kernels for these shapes need no scratchpad on this CPU: nothing to share";
}

}  // namespace
}  // namespace engine
