// Bulk conversions between f32 and the 16-bit float types, the kernels' way in and out of 16-bit
// storage. Rounding is to nearest even, bit for bit what float_to_bf16 / float_to_f16 give one
// value at a time (and what PyTorch and the GPU conversions give).
//
//   widen(bf16_data, DType::bf16, scratch, n);         // scratch[i] = float(bf16_data[i])
//   narrow(scratch, out, DType::bf16, n);               // out[i] = bf16(scratch[i])
//   widen(grad16, DType::bf16, grad32, n, true);        // grad32[i] += float(grad16[i])
//
// widen/narrow split a large call across the OpenMP threads; widen_serial/narrow_serial run on the
// calling thread, for kernels that convert chunks from inside their own parallel loop (a nested
// region, even one an `if` clause keeps serial, is a libgomp call per chunk).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace engine {

// dst[i] = (or +=, with accumulate) the f32 value of src[i]; src may already be f32.
void widen(const void* src, DType type, float* dst, int64_t n, bool accumulate = false);
// dst[i] = src[i] rounded to `type` (f32: copied).
void narrow(const float* src, void* dst, DType type, int64_t n);
void widen_serial(const void* src, DType type, float* dst, int64_t n, bool accumulate = false);
void narrow_serial(const float* src, void* dst, DType type, int64_t n);

// Below this many elements a memory-bound loop runs on the calling thread: opening a parallel
// region costs microseconds, about what two threads save on this much streaming work.
inline constexpr int64_t kSerialElements = 32768;

// One element, for kernels that read or write 16-bit storage as they go.
inline float load_float(const void* data, DType type, int64_t i) {
  switch (type) {
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

// data[i] += v, in whatever float type data holds (a 16-bit sum is rounded once).
inline void add_float(void* data, DType type, int64_t i, float v) {
  float total = load_float(data, type, i) + v;
  narrow_serial(&total, static_cast<std::byte*>(data) + i * int64_t(dtype_size(type)), type, 1);
}

}  // namespace engine
