// The GPU's peaks, measured, for the roofline of a GPU run's op table and its MFU.
//
// measure_matmul_flops: the FLOP/s of n x n x n cuBLASLt products in `type` (fp32
// without TF32, bf16 or fp16 with fp32 accumulation) on the current device, best of ten after a
// warm-up, on data that is never zeros. The MFU of a GPU run is taken against it. A build without
// CUDA has none (ops/no_cuda.cpp throws).
//
// measure_copy_bandwidth: the device memory's bytes per second (read and written) of a device-to-
// device copy of `bytes`, best of five after a warm-up.
//
//   double peak = cuda::measure_matmul_flops(DType::bf16);   // about 7.9e14 on an H200
//   double bandwidth = cuda::measure_copy_bandwidth();       // about 3e12 on an H100 (HBM3)
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::cuda {

double measure_matmul_flops(DType type, int64_t n = 8192);
double measure_copy_bandwidth(int64_t bytes = int64_t(1) << 30);

}  // namespace engine::cuda
