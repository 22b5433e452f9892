// Times the weight gradient of a linear layer, dW (M, K) += dy^T (M, rows) x (rows, K), in the ways
// oneDNN can compute it, beside the forward product of the same FLOPs, for the GEMM shapes of the
// benchmark GPT (bench/gpt-bench.yaml: 2048 rows, d_model 384). fp32 through sgemm, bf16 through the
// 16-bit matmul (gemm16). Threads: OMP_NUM_THREADS. Each figure is the median of --repeats runs.
//
//   OMP_NUM_THREADS=2 build/linear_weight_bench --repeats 7
//
// Prints one line per shape and variant: milliseconds and GFLOP/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "linalg/gemm.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"

namespace {

using engine::DType;
using engine::ops::Gemm16;

double median_ms(int repeats, const std::function<void()>& run) {
  run();  // warm-up: primitive creation, first touch
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// dst (cols, rows) = src (rows, cols)^T, in 32 x 32 tiles.
template <class T>
void transpose(const T* src, T* dst, int64_t rows, int64_t cols) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t c0 = 0; c0 < cols; c0 += 32)
      for (int64_t c = c0; c < std::min(cols, c0 + 32); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + 32); ++r) dst[c * rows + r] = src[r * cols + c];
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
  const int64_t rows = 2048;
  const int64_t shapes[][2] = {{1152, 384}, {384, 384}, {1536, 384}, {384, 1536}, {50257, 384}};  // (M, K)
  std::printf("%-12s %-34s %9s %9s\n", "M x K", "variant", "ms", "GFLOP/s");
  for (const auto& shape_mk : shapes) {
    const int64_t m = shape_mk[0], k = shape_mk[1];  // named variables: lambdas below capture them
    const double flops = 2.0 * double(rows) * double(m) * double(k);
    std::vector<float> dy(size_t(rows * m)), x(size_t(rows * k)), dw(size_t(m * k)), dyt(size_t(rows * m)),
        tmp(size_t(m * k));
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int(i % 17) - 8) / 8.0f;
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) / 6.0f;
    std::vector<uint16_t> dy16(dy.size()), x16(x.size()), dyt16(dy.size());
    for (size_t i = 0; i < dy.size(); ++i) dy16[i] = engine::float_to_bf16(dy[i]);
    for (size_t i = 0; i < x.size(); ++i) x16[i] = engine::float_to_bf16(x[i]);
    std::vector<uint16_t> y16(size_t(rows * m));
    const std::string shape = std::to_string(m) + "x" + std::to_string(k);
    auto report = [&](const char* variant, double ms) {
      std::printf("%-12s %-34s %9.2f %9.1f\n", shape.c_str(), variant, ms, flops / ms * 1e-6);
      std::fflush(stdout);
    };
    using engine::ops::sgemm;
    report("f32 forward (x W^T)", median_ms(repeats, [&] {
             sgemm('N', 'T', rows, m, k, 1.0f, x.data(), k, dw.data(), k, 0.0f, dyt.data(), m);
           }));
    report("f32 dW += dy^T x (T,N)", median_ms(repeats, [&] {
             sgemm('T', 'N', m, k, rows, 1.0f, dy.data(), m, x.data(), k, 1.0f, dw.data(), k);
           }));
    report("f32 dW = dy^T x (T,N, beta 0)", median_ms(repeats, [&] {
             sgemm('T', 'N', m, k, rows, 1.0f, dy.data(), m, x.data(), k, 0.0f, dw.data(), k);
           }));
    report("f32 transpose dy, dW += (N,N)", median_ms(repeats, [&] {
             transpose(dy.data(), dyt.data(), rows, m);
             sgemm('N', 'N', m, k, rows, 1.0f, dyt.data(), rows, x.data(), k, 1.0f, dw.data(), k);
           }));
    report("f32 dW^T = x^T dy (T,N) + add^T", median_ms(repeats, [&] {
             sgemm('T', 'N', k, m, rows, 1.0f, x.data(), k, dy.data(), m, 0.0f, tmp.data(), m);
#pragma omp parallel for schedule(static)
             for (int64_t j = 0; j < m; ++j)
               for (int64_t i = 0; i < k; ++i) dw[size_t(j * k + i)] += tmp[size_t(i * m + j)];
           }));
    report("f32 linear_weight_gradient", median_ms(repeats, [&] {
             engine::ops::linear_weight_gradient(dy.data(), x.data(), DType::f32, rows, m, k, dw.data());
           }));
    // Without a 16-bit matmul (an AVX2 CPU) bf16 linears run as fp32 on widened copies: the rows above.
    if (!engine::ops::matmul_16bit_available(DType::bf16)) continue;
    report("bf16 forward (x W^T)", median_ms(repeats, [&] {
             engine::ops::gemm16({false, true, rows, m, k, k, k, m, DType::bf16, DType::bf16, false}, x16.data(),
                                 dyt16.data(), nullptr, y16.data());
           }));
    report("bf16 dW += dy^T x (transa)", median_ms(repeats, [&] {
             engine::ops::gemm16({true, false, m, k, rows, m, k, k, DType::bf16, DType::f32, true}, dy16.data(),
                                 x16.data(), nullptr, dw.data());
           }));
    report("bf16 dW = dy^T x (transa, no sum)", median_ms(repeats, [&] {
             engine::ops::gemm16({true, false, m, k, rows, m, k, k, DType::bf16, DType::f32, false}, dy16.data(),
                                 x16.data(), nullptr, dw.data());
           }));
    report("bf16 linear_weight_gradient", median_ms(repeats, [&] {
             engine::ops::linear_weight_gradient(dy16.data(), x16.data(), DType::bf16, rows, m, k, dw.data());
           }));
    report("bf16 transpose dy, dW += (N,N)", median_ms(repeats, [&] {
             transpose(dy16.data(), dyt16.data(), rows, m);
             engine::ops::gemm16({false, false, m, k, rows, rows, k, k, DType::bf16, DType::f32, true}, dyt16.data(),
                                 x16.data(), nullptr, dw.data());
           }));
    report("bf16 dW^T = x^T dy (transa) + add^T", median_ms(repeats, [&] {
             engine::ops::gemm16({true, false, k, m, rows, k, m, m, DType::bf16, DType::f32, false}, x16.data(),
                                 dy16.data(), nullptr, tmp.data());
#pragma omp parallel for schedule(static)
             for (int64_t j = 0; j < m; ++j)
               for (int64_t i = 0; i < k; ++i) dw[size_t(j * k + i)] += tmp[size_t(i * m + j)];
           }));
    report("bf16 dW^T += x^T dy (transa,transb c)", median_ms(repeats, [&] {
             // dW^T (K, M) = x^T dy written through ldc into dW's transpose is not expressible
             // with a row-stride-only C; instead B = dy as (rows, M) and A = x^T: same as above
             // without the add, into tmp (timing of the product alone).
             engine::ops::gemm16({true, false, k, m, rows, k, m, m, DType::bf16, DType::f32, false}, x16.data(),
                                 dy16.data(), nullptr, tmp.data());
           }));
  }
  return 0;
}
