// Device conversions between f32 and the 16-bit float types, for the executor's planned casts
// around kernels that compute in fp32 (OpDef::cuda_16bit unset): the device twins of
// core/convert.h's widen and narrow, rounding to nearest even, enqueued on `stream`.
//
//   cuda::widen(bf16_data, DType::bf16, scratch, n, stream);   // scratch[i] = float(bf16_data[i])
//   cuda::narrow(scratch, out, DType::bf16, n, stream);         // out[i] = bf16(scratch[i])
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::cuda {

void widen(const void* src, DType type, float* dst, int64_t n, void* stream, bool accumulate = false);
void narrow(const float* src, void* dst, DType type, int64_t n, void* stream);

}  // namespace engine::cuda
