// CUDA kernels of copy (graph/op.cpp copy_kernel), cast (elementwise/cast.cpp) and host_copy
// (graph/recompute.cpp), and the executor's device conversions (cuda_convert.h).
//
// Conversions round to nearest even as core/dtype.cpp does, NaNs included: a NaN keeps its sign
// and payload bits the CPU's way (the hardware conversions would give the canonical NaN), so a
// value converted on either device has the same bits.
#include <cstddef>

#include "cuda_convert.h"
#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

// load_float / store_float with core/dtype.cpp's NaN bits.
__device__ inline float widen_one(const void* data, DType type, int64_t i) {
  if (type == DType::f16) {
    const auto bits = static_cast<const uint16_t*>(data)[i];
    if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0)  // NaN: f16_to_float's bits
      return __uint_as_float((uint32_t(bits & 0x8000u) << 16) | 0x7f800000u | (uint32_t(bits & 0x03ffu) << 13));
  }
  return load_float(data, type, i);
}
__device__ inline void narrow_one(void* data, DType type, int64_t i, float v) {
  const uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    if (type == DType::bf16) {
      static_cast<uint16_t*>(data)[i] = uint16_t((bits >> 16) | 0x0040u);  // float_to_bf16's quiet NaN
      return;
    }
    if (type == DType::f16) {
      static_cast<uint16_t*>(data)[i] = uint16_t(((bits >> 16) & 0x8000u) | 0x7e00u);  // float_to_f16's NaN
      return;
    }
  }
  store_float(data, type, i, v);
}

// dst (+)= src, each in its own float type; the sum in fp32, rounded once (the CPU's
// widen / add / narrow).
__global__ void convert_kernel(const void* src, DType from, void* dst, DType to, int64_t n, bool accumulate) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    float v = widen_one(src, from, i);
    if (accumulate) v = widen_one(dst, to, i) + v;
    narrow_one(dst, to, i, v);
  }
}

__global__ void widen_kernel(const void* src, DType type, float* dst, int64_t n, bool accumulate) {  // (n,)
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float v = widen_one(src, type, i);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

__global__ void narrow_kernel(const float* src, void* dst, DType type, int64_t n) {  // (n,)
  for (int64_t i = thread_index(); i < n; i += thread_stride()) narrow_one(dst, type, i, src[i]);
}

// output (+)= input in any float types. copy_kernel copies bytes for a same-type overwrite; cast_cpu
// converts through fp32 even then (quietening a signalling 16-bit NaN), and so does `cast` here.
void convert(const Node& node, const KernelContext& ctx, bool byte_copy, const char* name) {
  const ValueId in = node.inputs[0], out = node.outputs[0];
  const DType from = ctx.dtype(in), to = ctx.dtype(out);
  const int64_t n = ctx.shape(in).numel();
  const bool accumulate = ctx.accumulates(node, 0);
  if (n == 0) return;
  if (byte_copy && from == to && !accumulate) {
    check(cudaMemcpyAsync(ctx.data(out), ctx.data(in), size_t(n) * dtype_size(from), cudaMemcpyDeviceToDevice,
                          stream(ctx)),
          name);
    return;
  }
  convert_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(ctx.data(in), from, ctx.data(out), to, n, accumulate);
  check_launch(name);
}

}  // namespace

void copy(const Node& node, const KernelContext& ctx) { convert(node, ctx, true, "copy"); }
void cast(const Node& node, const KernelContext& ctx) { convert(node, ctx, false, "cast"); }

// A byte copy; one side may be pinned host memory (offloaded activations), so the direction is
// the runtime's to infer.
void host_copy(const Node& node, const KernelContext& ctx) {
  const auto bytes = size_t(value_bytes(ctx.graph->value(node.inputs[0])));
  if (bytes == 0) return;
  check(cudaMemcpyAsync(ctx.data(node.outputs[0]), ctx.data(node.inputs[0]), bytes, cudaMemcpyDefault, stream(ctx)),
        "host_copy");
}

void widen(const void* src, DType type, float* dst, int64_t n, void* stream, bool accumulate) {
  if (n == 0) return;
  widen_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, type, dst, n, accumulate);
  check_launch("widen");
}

void narrow(const float* src, void* dst, DType type, int64_t n, void* stream) {
  if (n == 0) return;
  narrow_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, type, n);
  check_launch("narrow");
}

}  // namespace engine::cuda
