// cublaslt_candidates: what cuBLASLt offers for GPT-2 124M's products at batch 32 x 1024 in bf16,
// and how fast each offer runs on this card. For each product (a linear's forward, input gradient
// and weight gradient, as ops/linalg/linear.cu issues them: column-major, the operands swapped),
// the heuristic's candidates (up to 16, in its order) are timed, each with its tile, split-K and
// reduction scheme; then the first candidate again with split-K forced to 2, 4 and 8 (in-place
// reduction). The engine runs the first candidate today: the table says what choosing otherwise
// would gain, per product. Each weight gradient is timed once more with the bias gradient in its
// epilogue (BGRADB), as the engine issues it.
//
//   build/cublaslt_candidates [ROWS]   (default 32768 = 32 x 1024; exit 77 without a device)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, int(s));
    std::exit(1);
  }
}

__global__ void fill(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(float(int((i * 2654435761u) % 2001u) - 1000) * 1e-3f);
}

// Column-major D (m, n) = op(A) op(B) + beta D, bf16 operands, f32 compute, `c_type` result.
struct Product {
  const char* name;
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType_t c_type;
  float beta;
};

struct Setup {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
};

Setup describe(const Product& p) {
  Setup s;
  check(cublasLtMatmulDescCreate(&s.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  check(cublasLtMatrixLayoutCreate(&s.a, CUDA_R_16BF, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda), "a");
  check(cublasLtMatrixLayoutCreate(&s.b, CUDA_R_16BF, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb), "b");
  check(cublasLtMatrixLayoutCreate(&s.c, p.c_type, p.m, p.n, p.ldc), "c");
  return s;
}

void release(const Setup& s) {
  cublasLtMatrixLayoutDestroy(s.a);
  cublasLtMatrixLayoutDestroy(s.b);
  cublasLtMatrixLayoutDestroy(s.c);
  cublasLtMatmulDescDestroy(s.op);
}

// The heuristic's first `wanted` offers (at most 16) for a described product that may use
// `workspace_bytes`, in its order; the status of the query.
cublasStatus_t offers(cublasLtHandle_t handle, const Setup& s, size_t workspace_bytes, int wanted,
                      cublasLtMatmulHeuristicResult_t* results, int* count) {
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "preference");
  const uint64_t bytes = workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes));
  *count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, s.op, s.a, s.b, s.c, s.c, preference, wanted, results, count);
  cublasLtMatmulPreferenceDestroy(preference);
  return status;
}

struct Config {
  uint32_t tile = 0, scheme = 0;
  int32_t splits = 1;
  int algo_id = 0;
};

Config config_of(const cublasLtMatmulAlgo_t& algo) {
  Config c;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &c.algo_id, sizeof(c.algo_id), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof(c.tile), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splits, sizeof(c.splits), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.scheme, sizeof(c.scheme),
                                       &written);
  return c;
}

// Milliseconds per product (median of 15 after 3 warm-up runs), or -1 where it does not run.
double time_ms(cublasLtHandle_t handle, const Setup& s, const Product& p, const cublasLtMatmulAlgo_t& algo,
               const void* a, const void* b, void* c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const float alpha = 1.0f;
  auto once = [&] {
    return cublasLtMatmul(handle, s.op, &alpha, a, s.a, b, s.b, &p.beta, c, s.c, c, s.c, &algo, workspace,
                          workspace_bytes, stream);
  };
  for (int i = 0; i < 3; ++i)
    if (once() != CUBLAS_STATUS_SUCCESS) return -1;
  std::vector<float> times;
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 15; ++i) {
    check(cudaEventRecord(start, stream), "record");
    once();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cublaslt_candidates: no CUDA device here\n");
    return 77;
  }
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 32768, d = 768, vocab = 50304;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  // (in, out) of GPT-2 124M's linears: qkv, attention projection, fc, fc projection, the head.
  const int64_t shapes[][2] = {{d, 3 * d}, {d, d}, {d, 4 * d}, {4 * d, d}, {d, vocab}};
  const char* names[] = {"qkv", "proj", "fc", "fc_proj", "head"};
  size_t largest = 0;
  for (auto& s : shapes) largest = std::max(largest, size_t(std::max(s[0], s[1]) * rows));
  void *a = nullptr, *b = nullptr, *c = nullptr, *workspace = nullptr;
  const size_t workspace_bytes = size_t(64) << 20;
  check(cudaMalloc(&a, largest * 2), "malloc");
  check(cudaMalloc(&b, largest * 2), "malloc");
  check(cudaMalloc(&c, largest * 4), "malloc");
  check(cudaMalloc(&workspace, workspace_bytes), "malloc");
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(a), largest);
  fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(b), largest);
  check(cudaMemset(c, 0, largest * 4), "memset");
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "handle");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "stream");
  std::printf("cuBLASLt candidates on %s (%d SMs), rows %lld, bf16 operands, f32 compute\n", prop.name,
              prop.multiProcessorCount, (long long)rows);
  std::printf("%-22s %4s %5s %5s %4s %6s %9s %8s\n", "product", "cand", "algo", "tile", "splk", "scheme", "ms",
              "TFLOP/s");
  for (size_t s = 0; s < 5; ++s) {
    const int64_t in = shapes[s][0], out = shapes[s][1];
    // As ops/linalg/linear.cu issues them (row-major operands as column-major transposes).
    const Product products[] = {
        {"forward", true, false, out, rows, in, in, in, out, CUDA_R_16BF, 0.0f},
        {"input gradient", false, false, in, rows, out, in, out, in, CUDA_R_16BF, 0.0f},
        {"weight gradient", false, true, in, out, rows, in, out, in, CUDA_R_32F, 1.0f},
    };
    for (const Product& p : products) {
      const Setup setup = describe(p);
      cublasLtMatmulHeuristicResult_t results[16]{};
      int count = 0;
      check(offers(handle, setup, workspace_bytes, 16, results, &count), "heuristic");
      const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
      const std::string label = std::string(names[s]) + " " + p.name;
      double first = 0, best = 1e30;
      int best_at = 0;
      auto row = [&](const char* cand, const cublasLtMatmulAlgo_t& algo, double ms) {
        const Config cfg = config_of(algo);
        std::printf("%-22s %4s %5d %5u %4d %6u %9.3f %8.1f\n", label.c_str(), cand, cfg.algo_id, cfg.tile, cfg.splits,
                    cfg.scheme, ms, ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
      };
      for (int i = 0; i < count; ++i) {
        const double ms = time_ms(handle, setup, p, results[i].algo, a, b, c, workspace, workspace_bytes, stream);
        row(std::to_string(i).c_str(), results[i].algo, ms);
        if (i == 0) first = ms;
        if (ms > 0 && ms < best) best = ms, best_at = i;
      }
      for (int32_t splits : {2, 4, 8}) {
        cublasLtMatmulAlgo_t algo = results[0].algo;
        const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_INPLACE;
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme));
        cublasLtMatmulHeuristicResult_t checked{};
        if (cublasLtMatmulAlgoCheck(handle, setup.op, setup.a, setup.b, setup.c, setup.c, &algo, &checked) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        const double ms = time_ms(handle, setup, p, algo, a, b, c, workspace, workspace_bytes, stream);
        row(("k" + std::to_string(splits)).c_str(), algo, ms);
        if (ms > 0 && ms < best) best = ms, best_at = 100 + splits;
      }
      std::printf("%-22s first %.3f ms, best %.3f ms (%s%d): %.2fx\n", label.c_str(), first, best,
                  best_at >= 100 ? "split-K " : "candidate ", best_at >= 100 ? best_at - 100 : best_at, first / best);
      if (p.tb) {
        // The weight gradient with the bias gradient in its epilogue (BGRADB: op(B)'s column sums
        // in f32), as the engine issues it: the heuristic's first, timed against the plain first.
        const Setup with_sums = describe(p);
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BGRADB;
        const void* sums = c;  // any device memory of out floats: timing only
        const cudaDataType_t sums_type = CUDA_R_32F;
        cublasLtMatmulDescSetAttribute(with_sums.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
        cublasLtMatmulDescSetAttribute(with_sums.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &sums, sizeof(sums));
        cublasLtMatmulDescSetAttribute(with_sums.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &sums_type,
                                       sizeof(sums_type));
        cublasLtMatmulHeuristicResult_t offered{};
        int offered_count = 0;
        const cublasStatus_t status = offers(handle, with_sums, workspace_bytes, 1, &offered, &offered_count);
        if (status != CUBLAS_STATUS_SUCCESS || offered_count == 0) {
          std::printf("%-22s with BGRADB: no algorithm offered (status %d)\n", label.c_str(), int(status));
        } else {
          const double ms = time_ms(handle, with_sums, p, offered.algo, a, b, static_cast<char*>(c) + out * 4,
                                    workspace, workspace_bytes - (size_t(1) << 20), stream);
          row("bgrd", offered.algo, ms);
          std::printf("%-22s with BGRADB: %.3f ms against %.3f ms plain (+%.3f ms for the column sums)\n",
                      label.c_str(), ms, first, ms - first);
        }
        release(with_sums);
      }
      std::printf("\n");
      release(setup);
    }
  }
  // GELU in the epilogue (ops/linalg/linear_gelu.h): the fc product with GELU_AUX_BIAS against
  // BIAS, and the fc projection's input gradient with DGELU and DGELU_BGRAD (f32 and bf16 sums)
  // against none; every candidate the heuristic offers for each.
  struct EpilogueCase {
    const char* name;
    Product p;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t vector_type;  // of the bias or its gradient (unused without one)
  };
  const int64_t fc = 4 * d;
  const Product fc_forward{"forward", true, false, fc, rows, d, d, d, fc, CUDA_R_16BF, 0.0f};
  const Product proj_input{"input gradient", false, false, fc, rows, d, fc, d, fc, CUDA_R_16BF, 0.0f};
  const EpilogueCase epilogue_cases[] = {
      {"fc forward BIAS", fc_forward, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF},
      {"fc forward GELU_AUX_BIAS", fc_forward, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF},
      {"fc_proj dx plain", proj_input, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_32F},
      {"fc_proj dx DGELU", proj_input, CUBLASLT_EPILOGUE_DGELU, CUDA_R_32F},
      {"fc_proj dx DGELU_BGRAD f32", proj_input, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_32F},
      {"fc_proj dx DGELU_BGRAD bf16", proj_input, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF},
  };
  std::printf("GELU epilogues (fc %lld x %lld, rows %lld)\n", (long long)d, (long long)fc, (long long)rows);
  for (const EpilogueCase& e : epilogue_cases) {
    const Setup setup = describe(e.p);
    check(cublasLtMatmulDescSetAttribute(setup.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.epilogue, sizeof(e.epilogue)),
          "epilogue");
    // D at c; the aux matrix 1 GiB past it; the bias (or its gradient) 2 GiB past it.
    char* base = static_cast<char*>(c);
    const void* aux = base + (size_t(1) << 30);
    const void* vector = base + (size_t(2) << 30);
    const int64_t aux_ld = e.p.m;
    if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT && e.epilogue != CUBLASLT_EPILOGUE_DGELU) {
      cublasLtMatmulDescSetAttribute(setup.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector));
      cublasLtMatmulDescSetAttribute(setup.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &e.vector_type,
                                     sizeof(e.vector_type));
    }
    if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT && e.epilogue != CUBLASLT_EPILOGUE_BIAS) {
      cublasLtMatmulDescSetAttribute(setup.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
      cublasLtMatmulDescSetAttribute(setup.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    }
    cublasLtMatmulHeuristicResult_t results[16]{};
    int count = 0;
    const cublasStatus_t status = offers(handle, setup, workspace_bytes, 16, results, &count);
    const double flops = 2.0 * double(e.p.m) * double(e.p.n) * double(e.p.k);
    double first = -1, best = 1e30;
    int best_at = -1;
    for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < count; ++i) {
      const double ms = time_ms(handle, setup, e.p, results[i].algo, a, b, c, workspace, workspace_bytes, stream);
      const Config cfg = config_of(results[i].algo);
      std::printf("%-30s %4d %5d %5u %4d %6u %9.3f %8.1f\n", e.name, i, cfg.algo_id, cfg.tile, cfg.splits, cfg.scheme,
                  ms, ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
      if (i == 0) first = ms;
      if (ms > 0 && ms < best) best = ms, best_at = i;
    }
    if (best_at < 0)
      std::printf("%-30s no algorithm runs (heuristic status %d, %d offered)\n", e.name, int(status), count);
    else
      std::printf("%-30s first %.3f ms, best %.3f ms (candidate %d)\n", e.name, first, best, best_at);
    release(setup);
  }
  cublasLtDestroy(handle);
  cudaStreamDestroy(stream);
  return 0;
}
