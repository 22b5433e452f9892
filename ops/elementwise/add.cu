// CUDA kernel of add (elementwise/add.cpp): y = a + b on f32, bf16 or f16 values read and written in
// their own types (fp32 addition, one rounding of each sum: the bits of the executor's widening and
// rounding); packs of 16 bytes where the arrays are aligned and share one type. add_arrays
// (cuda_convert.h) is the same sum on raw device arrays of one type.
#include "cuda_convert.h"
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "elementwise/add_math.h"

namespace engine::cuda {

namespace {

// T: the type of all three (void: mixed, each read by its own type).
template <class T>
__global__ void add_kernel(FloatArray<T> a, FloatArray<T> b, FloatArray<T> y, int64_t n, bool packed) {  // (n,) each
  int64_t done = 0;
  if constexpr (!std::is_void_v<T>) {
    constexpr int k = kPack<T>;
    if (packed) {
      done = n / k * k;
      for (int64_t p = thread_index() * k; p < done; p += thread_stride() * k) {
        float va[k], vb[k];
        load_pack(a.p, p, va);
        load_pack(b.p, p, vb);
#pragma unroll
        for (int j = 0; j < k; ++j) va[j] = ops::add_values(va[j], vb[j]);
        store_pack(y.p, p, va);
      }
    }
  }
  for (int64_t i = done + thread_index(); i < n; i += thread_stride())
    y.store(i, ops::add_values(a.load(i), b.load(i)));
}

// Packs where T is one storage type and the three arrays are 16-byte aligned.
template <class T>
void launch_add(FloatArray<T> a, FloatArray<T> b, FloatArray<T> y, int64_t n, cudaStream_t stream) {
  constexpr int k = kPack<T>;
  const bool packed = !std::is_void_v<T> && pack_aligned(a.p) && pack_aligned(b.p) && pack_aligned(y.p);
  add_kernel<T><<<blocks_for(packed ? (n + k - 1) / k : n), kThreads, 0, stream>>>(a, b, y, n, packed);
}

}  // namespace

void add(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  const ValueId a = node.inputs[0], b = node.inputs[1], y = node.outputs[0];
  with_float_type(ctx, {a, b, y}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_add<T>(float_array<T>(ctx, a), float_array<T>(ctx, b), float_array<T>(ctx, y), n, stream(ctx));
  });
  check_launch("add");
}

void add_arrays(const void* a, const void* b, void* y, DType type, int64_t n, void* stream) {
  if (n == 0) return;
  with_float_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto array = [](const void* p) { return FloatArray<T>{static_cast<T*>(const_cast<void*>(p))}; };
    launch_add<T>(array(a), array(b), array(y), n, static_cast<cudaStream_t>(stream));
  });
  check_launch("add_arrays");
}

}  // namespace engine::cuda
