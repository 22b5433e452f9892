// Helpers shared by the CUDA kernel files (ops/<family>/<op>.cu): the context's stream, checked
// launches, element loads and stores in any float type, and the launch shape of a flat loop.
//
//   __global__ void scale(const float* x, float* y, int64_t n) {        // (n,)
//     for (int64_t i = cuda::thread_index(); i < n; i += cuda::thread_stride()) y[i] = 2 * x[i];
//   }
//   scale<<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(ctx)>>>(x, y, n);
//   cuda::check_launch("scale");
//
// Kernels meant to give the CPU's bits are compiled with -fmad=false and without fast math
// (CMake sets it for every .cu in ops/), and call the same __host__ __device__ functions as the
// CPU kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "graph/op.h"

namespace engine::cuda {

inline constexpr int kThreads = 256;

inline cudaStream_t stream(const KernelContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Throws InternalError naming `what` and CUDA's message when a runtime call failed.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw InternalError(std::string(what) + ": " + cudaGetErrorString(status));
}
// After a <<<...>>> launch: a bad configuration shows here, a fault at the next synchronisation.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Blocks for a grid-stride loop over n elements: enough to fill the device, never more than needed.
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

__device__ inline int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t thread_stride() { return int64_t(gridDim.x) * blockDim.x; }

// One element of a float value stored as f32, bf16 or f16, widened exactly; and a float rounded to
// nearest even into that type (what core/convert.h does on the CPU).
__device__ inline float load_float(const void* data, DType type, int64_t i) {
  switch (type) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}
__device__ inline void store_float(void* data, DType type, int64_t i, float v) {
  switch (type) {
    case DType::bf16:
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
      break;
    case DType::f16:
      static_cast<__half*>(data)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(data)[i] = v;
  }
}

}  // namespace engine::cuda
