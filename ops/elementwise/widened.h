// The route for 16-bit values through kernels that compute in fp32: element-wise kernels take
// them a chunk at a time (for_each_chunk), row kernels a row at a time (InputRows, OutputRows).
// Either way the widened values stay in cache and the data crosses memory once; f32 values are
// read and written in place, so a kernel uses one code path for every storage type. The ops of a
// model's step that are neither (the embedding's scatter-add) and the generic ops no model uses
// (matmul, softmax, reduce_sum) run on whole-tensor f32 copies by the executor's planned casts
// (runtime/planned_casts.h); Cli.ABf16StepWidensWholeTensorsOnlyForTheEmbeddingScatter lists
// which ops of a bf16 GPT and Llama step take that route.
//
// Chunks. Each 16-bit input chunk is widened into a per-thread buffer, the body computes the
// outputs in fp32, and they are rounded back (or added to the stored values when the output
// accumulates). The chunks convert with the serial widen/narrow (the loop here is the parallel
// one), and work under kSerialElements runs on the calling thread. Bodies mark their loop
// `omp simd`: the chunk pointers come through arrays, so without it the compiler must assume they
// alias.
//
//   for_each_chunk<1, 1>(ctx, {x}, {y}, {false}, n,
//                        [](const float* const* in, float* const* out, int64_t begin, int64_t count) {
//                          const float* x = in[0];
//                          float* y = out[0];
//   #pragma omp simd
//                          for (int64_t i = 0; i < count; ++i) y[i] = gelu(x[i]);
//                        });
//
// Rows. The caller's row loop is the parallel one; each thread owns one buffer per value, which
// row() fills (16-bit) or ignores (f32, read in place). An output row is written in fp32 where
// row() points (for an accumulating output that is already the stored values, widened) and
// rounded back by store():
//
//   const InputRows x = input_rows(ctx, node.inputs[0], width);
//   const OutputRows y = output_rows(ctx, node.outputs[0], width, ctx.accumulates(node, 0));
//   #pragma omp parallel
//   {
//     std::vector<float> x_buffer = x.buffer(), y_buffer = y.buffer();
//   #pragma omp for
//     for (int64_t r = 0; r < rows; ++r) {
//       const float* xr = x.row(r, x_buffer.data());
//       float* yr = y.row(r, y_buffer.data());
//       ... yr[i] = accumulate ? yr[i] + v : v ...
//       y.store(r, yr);
//     }
//   }
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "core/convert.h"
#include "graph/op.h"

namespace engine::ops {

// What an op's row in `engine plan`'s precision table says it computes (OpDef::native_16bit).
inline constexpr const char* kWidenedChunks = "fp32 on 16-bit chunks widened in cache";
inline constexpr const char* kWidenedRows = "fp32 on 16-bit rows widened in cache";

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

// Rows of `width` values of one value, `stride` values apart (default: packed rows).
struct InputRows {
  const std::byte* data;
  DType type;
  int64_t width, stride;
  const float* row(int64_t r, float* buffer) const {
    if (type == DType::f32) return reinterpret_cast<const float*>(data) + r * stride;
    widen_serial(data + r * stride * 2, type, buffer, width);
    return buffer;
  }
  // A buffer for row(): empty for f32, which reads in place.
  std::vector<float> buffer() const { return std::vector<float>(type == DType::f32 ? 0 : size_t(width)); }
};

struct OutputRows {
  std::byte* data;
  DType type;
  int64_t width, stride;
  bool accumulate;
  // Where row r is written in fp32: in place for f32, else `buffer`, holding the stored values
  // when the output accumulates.
  float* row(int64_t r, float* buffer) const {
    if (type == DType::f32) return reinterpret_cast<float*>(data) + r * stride;
    if (accumulate) widen_serial(data + r * stride * 2, type, buffer, width);
    return buffer;
  }
  // Rounds a 16-bit row back into storage (f32 rows are already there).
  void store(int64_t r, const float* row) const {
    if (type != DType::f32) narrow_serial(row, data + r * stride * 2, type, width);
  }
  std::vector<float> buffer() const { return std::vector<float>(type == DType::f32 ? 0 : size_t(width)); }
};

inline InputRows input_rows(const KernelContext& ctx, ValueId id, int64_t width, int64_t stride = 0) {
  return {static_cast<const std::byte*>(ctx.data(id)), ctx.dtype(id), width, stride ? stride : width};
}
inline OutputRows output_rows(const KernelContext& ctx, ValueId id, int64_t width, bool accumulate,
                              int64_t stride = 0) {
  return {static_cast<std::byte*>(ctx.data(id)), ctx.dtype(id), width, stride ? stride : width, accumulate};
}

}  // namespace engine::ops
