// The GPU's matmul peak, measured: the FLOP/s of n x n x n cuBLASLt products in `type` (fp32
// without TF32, bf16 or fp16 with fp32 accumulation) on the current device, best of ten after a
// warm-up, on data that is never zeros. The MFU of a GPU run is taken against it. A build without
// CUDA has none (ops/no_cuda.cpp throws).
//
//   double peak = cuda::measure_matmul_flops(DType::bf16);   // about 7.9e14 on an H200
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::cuda {

double measure_matmul_flops(DType type, int64_t n = 8192);

}  // namespace engine::cuda
