// CUDA kernels of the optimizer step (optim/device_update.h). The element math is
// optim/update_math.h's, the CPU scalar path's functions; built with -fmad=false and without fast
// math, so the only fused multiply-adds are the written fmaf calls (fma.rn.f32), sqrtf and `/` are
// IEEE-rounded and subnormals are kept: every element gets the CPU's bits.
//
// The flat kernels run a grid-stride loop over packs of 16 bytes where the arrays allow it (see
// Split), and element by element over the few elements before and after.
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <string>

#include "cuda_util.cuh"
#include "optim/device_update.h"
#include "optim/update_math.h"

namespace engine::cuda {

namespace {

// A flat loop's shape: elements [0, head) and [head + packs * width, n) one at a time, the packs of
// `width` elements between them with 16-byte loads. Packs need every (non-null) array at the same
// offset from a 16-byte boundary (element-aligned); otherwise head = n and there are no packs.
struct Split {
  int64_t head = 0, packs = 0, n = 0;
  int64_t threads() const { return packs > head ? packs : head; }  // the tail (< width) fits in either
};

Split split(int64_t n, int width, int64_t element, std::initializer_list<const void*> arrays) {
  uintptr_t offset = 0;
  bool first = true, packable = true;
  for (const void* p : arrays) {
    if (!p) continue;
    const auto at = reinterpret_cast<uintptr_t>(p);
    packable = packable && at % uintptr_t(element) == 0 && (first || at % 16 == offset);
    offset = at % 16;
    first = false;
  }
  if (!packable) return {n, 0, n};
  const int64_t head = std::min(n, int64_t((16 - offset) % 16) / element);
  return {head, (n - head) / width, n};
}

constexpr int kFloatPack = 4;

// A kernel's scalars: given by value at launch, or read from device memory when the kernel runs
// (a CUDA graph's update, whose learning rate and clipping change every step).
template <class T>
struct ScalarSource {
  T value;
  const T* device = nullptr;
  __device__ T get() const { return device ? *device : value; }
};

__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, Split sp, ScalarSource<AdamWScalars> source) {
  const AdamWScalars s = source.get();
  const int64_t start = thread_index(), stride = thread_stride();
  float* w4 = w + sp.head;
  const float* g4 = g + sp.head;
  float* m4 = m + sp.head;
  float* v4 = v + sp.head;
  for (int64_t i = start; i < sp.packs; i += stride) {
    float4 wk = reinterpret_cast<const float4*>(w4)[i];
    const float4 gk = reinterpret_cast<const float4*>(g4)[i];
    float4 mk = reinterpret_cast<const float4*>(m4)[i];
    float4 vk = reinterpret_cast<const float4*>(v4)[i];
    adamw_element(wk.x, gk.x, mk.x, vk.x, s);
    adamw_element(wk.y, gk.y, mk.y, vk.y, s);
    adamw_element(wk.z, gk.z, mk.z, vk.z, s);
    adamw_element(wk.w, gk.w, mk.w, vk.w, s);
    reinterpret_cast<float4*>(w4)[i] = wk;
    reinterpret_cast<float4*>(m4)[i] = mk;
    reinterpret_cast<float4*>(v4)[i] = vk;
  }
  for (int64_t i = start; i < sp.head; i += stride) adamw_element(w[i], g[i], m[i], v[i], s);
  for (int64_t i = sp.head + sp.packs * kFloatPack + start; i < sp.n; i += stride)
    adamw_element(w[i], g[i], m[i], v[i], s);
}

__global__ void sgd_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ buf, Split sp,
                           ScalarSource<SgdScalars> source) {
  const SgdScalars s = source.get();
  const int64_t start = thread_index(), stride = thread_stride();
  float* w4 = w + sp.head;
  const float* g4 = g + sp.head;
  float* b4 = buf ? buf + sp.head : nullptr;
  for (int64_t i = start; i < sp.packs; i += stride) {
    float4 wk = reinterpret_cast<const float4*>(w4)[i];
    const float4 gk = reinterpret_cast<const float4*>(g4)[i];
    if (b4) {
      // The first step overwrites the buffer without reading it (it may hold anything).
      float4 bk = s.first ? float4{} : reinterpret_cast<const float4*>(b4)[i];
      sgd_element(wk.x, gk.x, &bk.x, s);
      sgd_element(wk.y, gk.y, &bk.y, s);
      sgd_element(wk.z, gk.z, &bk.z, s);
      sgd_element(wk.w, gk.w, &bk.w, s);
      reinterpret_cast<float4*>(b4)[i] = bk;
    } else {
      sgd_element(wk.x, gk.x, nullptr, s);
      sgd_element(wk.y, gk.y, nullptr, s);
      sgd_element(wk.z, gk.z, nullptr, s);
      sgd_element(wk.w, gk.w, nullptr, s);
    }
    reinterpret_cast<float4*>(w4)[i] = wk;
  }
  for (int64_t i = start; i < sp.head; i += stride) sgd_element(w[i], g[i], buf ? buf + i : nullptr, s);
  for (int64_t i = sp.head + sp.packs * kFloatPack + start; i < sp.n; i += stride)
    sgd_element(w[i], g[i], buf ? buf + i : nullptr, s);
}

__global__ void scale_kernel(float* __restrict__ x, Split sp, ScalarSource<float> source) {
  const float factor = source.get();
  const int64_t start = thread_index(), stride = thread_stride();
  float* x4 = x + sp.head;
  for (int64_t i = start; i < sp.packs; i += stride) {
    float4 v = reinterpret_cast<const float4*>(x4)[i];
    v.x *= factor;
    v.y *= factor;
    v.z *= factor;
    v.w *= factor;
    reinterpret_cast<float4*>(x4)[i] = v;
  }
  for (int64_t i = start; i < sp.head; i += stride) x[i] *= factor;
  for (int64_t i = sp.head + sp.packs * kFloatPack + start; i < sp.n; i += stride) x[i] *= factor;
}

// One half-warp per block: thread j of the 16 runs lane j (elements j, j + 16, ... in order), then
// the tree as shuffles within the half-warp: at width w, thread j < w adds thread j + w's lane, as
// block_squares does (the other threads' sums are never read). Every thread of a warp runs the same
// iterations (the loop steps per warp), so the full-mask shuffles are safe.
__global__ void norm_partials_kernel(const float* __restrict__ x, int64_t blocks, double* __restrict__ partials) {
  constexpr int kPerLane = int(kShardBlock / kSquareLanes);
  const int lane = int(threadIdx.x % kSquareLanes);
  const int64_t half_warp = thread_index() / kSquareLanes;
  const int64_t warp = half_warp / 2, warps = thread_stride() / 32;
  for (int64_t pair = warp; pair * 2 < blocks; pair += warps) {
    const int64_t block = pair * 2 + half_warp % 2;
    double sum = 0;
    if (block < blocks) {
      const float* b = x + block * kShardBlock + lane;
#pragma unroll 16
      for (int k = 0; k < kPerLane; ++k) sum = add_square(sum, b[k * kSquareLanes]);
    }
    for (int width = kSquareLanes / 2; width > 0; width /= 2) {
      const double other = __shfl_down_sync(0xffffffffu, sum, width, kSquareLanes);
      sum = sum + other;
    }
    if (lane == 0 && block < blocks) partials[block] = sum;
  }
}

// sum[i] = round(float(sum[i]) + float(micro[i])) in T, with the CPU conversions' NaN bits.
template <class T>
__global__ void accumulate_kernel(T* __restrict__ sum, const T* __restrict__ micro, Split sp) {
  constexpr int width = kPack<T>;
  const int64_t start = thread_index(), stride = thread_stride();
  T* s = sum + sp.head;
  const T* a = micro + sp.head;
  for (int64_t i = start; i < sp.packs; i += stride) {
    float x[width], y[width];
    load_pack(s, i * width, x);
    load_pack(a, i * width, y);
#pragma unroll
    for (int j = 0; j < width; ++j) x[j] = x[j] + y[j];
    store_pack(s, i * width, x);
  }
  for (int64_t i = start; i < sp.head; i += stride) sum[i] = from_float<T>(to_float(sum[i]) + to_float(micro[i]));
  for (int64_t i = sp.head + sp.packs * width + start; i < sp.n; i += stride)
    sum[i] = from_float<T>(to_float(sum[i]) + to_float(micro[i]));
}

template <class T>
void accumulate(void* sum, const void* micro, int64_t n, cudaStream_t stream) {
  const Split sp = split(n, kPack<T>, int64_t(sizeof(T)), {sum, micro});
  accumulate_kernel<T>
      <<<blocks_for(sp.threads()), kThreads, 0, stream>>>(static_cast<T*>(sum), static_cast<const T*>(micro), sp);
  check_launch("accumulate_gradients");
}

}  // namespace

namespace {

void adamw(float* w, const float* g, float* m, float* v, int64_t n, ScalarSource<AdamWScalars> s, void* stream) {
  if (n <= 0) return;
  const Split sp = split(n, kFloatPack, 4, {w, g, m, v});
  adamw_kernel<<<blocks_for(sp.threads()), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(w, g, m, v, sp, s);
  check_launch("adamw_update");
}

void sgd(float* w, const float* g, float* momentum_buffer, int64_t n, ScalarSource<SgdScalars> s, void* stream) {
  if (n <= 0) return;
  const Split sp = split(n, kFloatPack, 4, {w, g, momentum_buffer});
  sgd_kernel<<<blocks_for(sp.threads()), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(w, g, momentum_buffer, sp,
                                                                                           s);
  check_launch("sgd_update");
}

void scale_by(float* x, int64_t n, ScalarSource<float> factor, void* stream) {
  if (n <= 0) return;
  const Split sp = split(n, kFloatPack, 4, {x});
  scale_kernel<<<blocks_for(sp.threads()), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, sp, factor);
  check_launch("scale");
}

}  // namespace

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s, void* stream) {
  adamw(w, g, m, v, n, {s}, stream);
}
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars* s, void* stream) {
  adamw(w, g, m, v, n, {AdamWScalars{}, s}, stream);
}
void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s, void* stream) {
  sgd(w, g, momentum_buffer, n, {s}, stream);
}
void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars* s, void* stream) {
  sgd(w, g, momentum_buffer, n, {SgdScalars{}, s}, stream);
}
void scale(float* x, int64_t n, float factor, void* stream) { scale_by(x, n, {factor}, stream); }
void scale(float* x, int64_t n, const float* factor, void* stream) { scale_by(x, n, {0.0f, factor}, stream); }

void norm_partials(const float* x, int64_t blocks, double* partials, void* stream) {
  if (blocks <= 0) return;
  // Two blocks per warp, 16 warps (32 blocks) per 512-thread CUDA block.
  constexpr int threads = 512;
  const int64_t grid = (blocks + threads / kSquareLanes - 1) / (threads / kSquareLanes);
  norm_partials_kernel<<<unsigned(grid < 65535 * 8 ? grid : 65535 * 8), threads, 0,
                         static_cast<cudaStream_t>(stream)>>>(x, blocks, partials);
  check_launch("norm_partials");
}

void accumulate_gradients(void* sum, const void* micro, DType type, int64_t n, void* stream) {
  if (n <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DType::f32:
      return accumulate<float>(sum, micro, n, s);
    case DType::bf16:
      return accumulate<__nv_bfloat16>(sum, micro, n, s);
    case DType::f16:
      return accumulate<__half>(sum, micro, n, s);
    default:
      break;
  }
  throw InternalError(std::string("accumulate_gradients takes f32, bf16 or f16, not ") + std::string(dtype_name(type)));
}

}  // namespace engine::cuda
