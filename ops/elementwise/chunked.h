// Elementwise kernels over 16-bit storage, in cache-sized chunks.
//
// A kernel whose values are bf16 or f16 computes in fp32 one chunk at a time: each 16-bit input
// chunk is widened into a per-thread buffer, the body computes the outputs in fp32, and they are
// rounded back (or added to the stored values when the output accumulates). Compared with widening
// whole tensors into scratch (the executor's fallback), the data stays in cache and crosses memory
// once. f32 values are read in place, so a kernel can use this for its 16-bit case only.
//
// The chunks convert with the serial widen/narrow (the loop here is the parallel one), and work
// under kSerialElements runs on the calling thread. Bodies mark their loop `omp simd`: the chunk
// pointers come through arrays, so without it the compiler must assume they alias.
//
//   for_each_chunk<1, 1>(ctx, {x}, {y}, {false}, n,
//                        [](const float* const* in, float* const* out, int64_t begin, int64_t count) {
//                          const float* x = in[0];
//                          float* y = out[0];
//   #pragma omp simd
//                          for (int64_t i = 0; i < count; ++i) y[i] = gelu(x[i]);
//                        });
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "core/convert.h"
#include "graph/op.h"

namespace engine::ops {

inline constexpr int64_t kChunk = 1024;  // a multiple of 4: dropout's random blocks align with it

// Whether every listed value is stored in f32 (then a kernel takes its plain path).
inline bool all_f32(const KernelContext& ctx, std::initializer_list<ValueId> values) {
  return std::all_of(values.begin(), values.end(), [&](ValueId id) { return ctx.dtype(id) == DType::f32; });
}

template <size_t In, size_t Out, class Body>
void for_each_chunk(const KernelContext& ctx, const std::array<ValueId, In>& inputs,
                    const std::array<ValueId, Out>& outputs, const std::array<bool, Out>& accumulate, int64_t n,
                    Body body) {
#pragma omp parallel for schedule(static) if (n > kSerialElements)
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t count = std::min(kChunk, n - begin);
    alignas(64) float in_buffer[In][kChunk];
    alignas(64) float out_buffer[Out][kChunk];
    const float* in[In];
    float* out[Out];
    for (size_t i = 0; i < In; ++i) {
      const DType type = ctx.dtype(inputs[i]);
      const auto* data = static_cast<const std::byte*>(ctx.data(inputs[i])) + begin * int64_t(dtype_size(type));
      if (type == DType::f32) {
        in[i] = reinterpret_cast<const float*>(data);
      } else {
        widen_serial(data, type, in_buffer[i], count);
        in[i] = in_buffer[i];
      }
    }
    for (size_t o = 0; o < Out; ++o) out[o] = out_buffer[o];
    body(in, out, begin, count);
    for (size_t o = 0; o < Out; ++o) {
      const DType type = ctx.dtype(outputs[o]);
      auto* data = static_cast<std::byte*>(ctx.data(outputs[o])) + begin * int64_t(dtype_size(type));
      if (accumulate[o]) widen_serial(data, type, out[o], count, true);  // out = stored + fresh
      narrow_serial(out[o], data, type, count);
    }
  }
}

}  // namespace engine::ops
