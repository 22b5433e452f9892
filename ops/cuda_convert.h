// Device conversions between f32 and the 16-bit float types, for the executor's planned casts
// around kernels that compute in fp32 (OpDef::cuda_16bit unset): the device twins of
// core/convert.h's widen and narrow, rounding to nearest even, enqueued on `stream`; and the add
// op's sum on raw arrays, for host-only files (a .cpp cannot launch kernels).
//
//   cuda::widen(bf16_data, DType::bf16, scratch, n, stream);   // scratch[i] = float(bf16_data[i])
//   cuda::narrow(scratch, out, DType::bf16, n, stream);         // out[i] = bf16(scratch[i])
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::cuda {

void widen(const void* src, DType type, float* dst, int64_t n, void* stream, bool accumulate = false);
void narrow(const float* src, void* dst, DType type, int64_t n, void* stream);

// y[i] = a[i] + b[i] on n elements of `type` (f32, bf16 or f16): the add op's kernel and bits (an
// fp32 sum rounded once), for host code that holds raw device arrays. y may be a or b.
void add_arrays(const void* a, const void* b, void* y, DType type, int64_t n, void* stream);

}  // namespace engine::cuda
