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
#include <initializer_list>
#include <string>
#include <type_traits>

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

// ---- Typed elements: the kernels that read and write 16-bit values directly -----------------------

// A float element widened exactly, and a float rounded to nearest even into the element type, with
// the NaN bits of the executor's conversions (elementwise/cast.cu widen_one / narrow_one, the CPU's
// core/dtype.cpp): an f16 NaN keeps its sign and payload, a NaN narrowed keeps its sign (bf16: and
// its high payload bits) and is made quiet. So a kernel reading and writing 16-bit values directly
// gives the bits of its f32 run between the executor's widening and rounding, NaNs included.
__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_float(__half v) {
  const uint32_t bits = __half_as_ushort(v);
  if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0)
    return __uint_as_float(((bits & 0x8000u) << 16) | 0x7f800000u | ((bits & 0x03ffu) << 13));
  return __half2float(v);
}
template <class T>
__device__ inline T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(uint16_t((bits >> 16) | 0x0040u));
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    const uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return __ushort_as_half(uint16_t(((bits >> 16) & 0x8000u) | 0x7e00u));
    return __float2half_rn(v);
  } else {
    return v;
  }
}

// A flat array of floats stored as T (float, __nv_bfloat16 or __half), or, for T = void, in the
// type `type` read at run time: the kernels' operands, instantiated per
// storage type where the types agree and runtime-typed where they are mixed. `a + k` is the array
// from element k on; `if (a)` tests for null. (The row programs read them through row_load /
// row_store, found by argument-dependent lookup.)
template <class T>
struct FloatArray {
  T* p = nullptr;
  __device__ float load(int64_t i) const { return to_float(p[i]); }
  __device__ void store(int64_t i, float v) const { p[i] = from_float<T>(v); }
  __host__ __device__ FloatArray operator+(int64_t k) const { return {p + k}; }
  __host__ __device__ explicit operator bool() const { return p != nullptr; }
};
template <>
struct FloatArray<void> {
  void* p = nullptr;
  DType type = DType::f32;
  __device__ float load(int64_t i) const {
    switch (type) {
      case DType::bf16:
        return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
      case DType::f16:
        return to_float(static_cast<const __half*>(p)[i]);
      default:
        return static_cast<const float*>(p)[i];
    }
  }
  __device__ void store(int64_t i, float v) const {
    switch (type) {
      case DType::bf16:
        static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(v);
        break;
      case DType::f16:
        static_cast<__half*>(p)[i] = from_float<__half>(v);
        break;
      default:
        static_cast<float*>(p)[i] = v;
    }
  }
  __host__ __device__ FloatArray operator+(int64_t k) const {
    return {p ? static_cast<char*>(p) + k * int64_t(type == DType::f32 ? 4 : 2) : nullptr, type};
  }
  __host__ __device__ explicit operator bool() const { return p != nullptr; }
};
template <class T>
__device__ inline float row_load(const FloatArray<T>& a, int64_t i) {
  return a.load(i);
}
template <class T>
__device__ inline void row_store(const FloatArray<T>& a, int64_t i, float v) {
  a.store(i, v);
}
// What a.store(i, v) leaves, read back: v rounded to the array's type, in registers.
template <class T>
__device__ inline float row_stored(const FloatArray<T>& a, float v) {
  if constexpr (std::is_void_v<T>) {
    switch (a.type) {
      case DType::bf16:
        return to_float(from_float<__nv_bfloat16>(v));
      case DType::f16:
        return to_float(from_float<__half>(v));
      default:
        return v;
    }
  } else {
    return to_float(from_float<T>(v));
  }
}

// Value `id` of the context as a FloatArray<T> (T void: typed by ctx.dtype(id)); a null array for
// kNoValue-like absent operands is FloatArray<T>{}.
template <class T>
FloatArray<T> float_array(const KernelContext& ctx, ValueId id) {
  if constexpr (std::is_void_v<T>)
    return {ctx.data(id), ctx.dtype(id)};
  else
    return {static_cast<T*>(ctx.data(id))};
}

template <class T>
struct TypeTag {
  using type = T;
};
// Calls f(TypeTag<T>{}) with T the storage type of `type` (float, __nv_bfloat16, __half).
template <class F>
void with_float_type(DType type, F&& f) {
  switch (type) {
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::f16:
      return f(TypeTag<__half>{});
    case DType::f32:
      return f(TypeTag<float>{});
    default:
      throw InternalError("a float kernel got a value of type " + std::string(dtype_name(type)));
  }
}
// The same with T the storage type shared by every value of `ids`, or T = void when their types
// differ (each then read by its own type).
template <class F>
void with_float_type(const KernelContext& ctx, std::initializer_list<ValueId> ids, F&& f) {
  const DType first = ctx.dtype(*ids.begin());
  bool same = true;
  for (ValueId id : ids) same = same && ctx.dtype(id) == first;
  if (!same) return f(TypeTag<void>{});
  with_float_type(first, f);
}

// Packs of 16 bytes (4 floats or 8 16-bit values): the vector loads and stores of the flat loops,
// at element offsets that are multiples of the pack's width, on 16-byte aligned arrays.
template <class T>
inline constexpr int kPack = int(16 / sizeof(T));
template <>
inline constexpr int kPack<void> = 1;  // runtime-typed arrays: one element at a time
template <class T>
__device__ inline void load_pack(const T* p, int64_t i, float (&out)[kPack<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p + i);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kPack<T>; ++j) out[j] = to_float(e[j]);
}
template <class T>
__device__ inline void store_pack(T* p, int64_t i, const float (&v)[kPack<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < kPack<T>; ++j) e[j] = from_float<T>(v[j]);
  *reinterpret_cast<uint4*>(p + i) = raw;
}
inline bool pack_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The row programs' pack access (nn/row_programs.h) on a typed array: one 16-byte access where the
// pack is 16 bytes (the caller checked the row's alignment), else element by element.
template <int P, class T>
__device__ inline void row_load_pack(const FloatArray<T>& a, int64_t pack, float (&v)[P]) {
  if constexpr (!std::is_void_v<T> && P == kPack<T>) {
    load_pack(a.p, pack * P, v);
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) v[j] = a.load(pack * P + j);
  }
}
template <int P, class T>
__device__ inline void row_store_pack(const FloatArray<T>& a, int64_t pack, const float (&v)[P]) {
  if constexpr (!std::is_void_v<T> && P == kPack<T>) {
    store_pack(a.p, pack * P, v);
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) a.store(pack * P + j, v[j]);
  }
}

}  // namespace engine::cuda
