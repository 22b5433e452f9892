// CUDA kernels of the optimizer step (optim/device_update.h). The element math is
// optim/update_math.h's, the CPU scalar path's functions; built with -fmad=false and without fast
// math, so the only fused multiply-adds are the written fmaf calls (fma.rn.f32), sqrtf and `/` are
// IEEE-rounded and subnormals are kept: every element gets the CPU's bits.
//
// The flat kernels run a grid-stride loop over packs of 16 bytes where the arrays allow it (see
// Split), and element by element over the few elements before and after; the multi-tensor update
// runs a block per chunk of its table (optim/update_chunks.h), packed the same way.
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

// One half-warp per block: thread j of the 16 runs lane j (elements j, j + 16, ... in order), then
// the tree as shuffles within the half-warp: at width w, thread j < w adds thread j + w's lane, as
// block_squares does (the other threads' sums are never read). Every thread of a warp runs the same
// iterations (the loop steps per warp), so the full-mask shuffles are safe. 16-bit values are
// widened exactly: the partial sums of their fp32 widening.
template <class T>
__global__ void norm_partials_kernel(const T* __restrict__ x, int64_t blocks, double* __restrict__ partials) {
  constexpr int kPerLane = int(kShardBlock / kSquareLanes);
  const int lane = int(threadIdx.x % kSquareLanes);
  const int64_t half_warp = thread_index() / kSquareLanes;
  const int64_t warp = half_warp / 2, warps = thread_stride() / 32;
  for (int64_t pair = warp; pair * 2 < blocks; pair += warps) {
    const int64_t block = pair * 2 + half_warp % 2;
    double sum = 0;
    if (block < blocks) {
      const T* b = x + block * kShardBlock + lane;
#pragma unroll 16
      for (int k = 0; k < kPerLane; ++k) sum = add_square(sum, to_float(b[k * kSquareLanes]));
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

// decide_update, phase one: chunk c's sum, one thread per chunk.
__global__ void norm_chunk_sums_kernel(const double* __restrict__ partials, int64_t count, double* __restrict__ sums) {
  const int64_t chunks = norm_chunks(count);
  for (int64_t c = thread_index(); c < chunks; c += thread_stride()) sums[c] = norm_chunk_sum(partials, count, c);
}

// Phase two, on one thread: the chunks' sums in order, the norm and the decision.
__global__ void decide_update_kernel(const double* __restrict__ sums, int64_t chunks, MultiTensorScalars* scalars) {
  if (thread_index() != 0) return;
  scalars->decision = engine::decide_update(sqrt(sum_in_order(sums, chunks)), scalars->policy);
}

// The update program's memory policy (update_chunks.h update_chunk) on the device: gradients of
// type G, copies of type T (float: none). At a pack: 16-byte loads and stores of w, m and v, the 4
// gradients in one access of their size, the 4 copies in one store where aligned (place_packs).
template <class G, class T>
struct DeviceUpdateMemory {
  __device__ void load4(const float* p, float (&out)[4]) const {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
  __device__ void store4(float* p, const float (&in)[4]) const {
    *reinterpret_cast<float4*>(p) = float4{in[0], in[1], in[2], in[3]};
  }
  __device__ void gradients4(const void* g, int64_t at, float (&out)[4]) const {
    if constexpr (std::is_same_v<G, float>) {
      load4(static_cast<const float*>(g) + at, out);
    } else {
      union {
        uint2 bits;
        G e[4];
      } pack;
      pack.bits = *reinterpret_cast<const uint2*>(static_cast<const G*>(g) + at);
#pragma unroll
      for (int j = 0; j < 4; ++j) out[j] = to_float(pack.e[j]);
    }
  }
  __device__ float gradient(const void* g, int64_t i) const { return to_float(static_cast<const G*>(g)[i]); }
  __device__ void copies4(void* copy, int64_t at, const float (&w)[4], bool packed) const {
    T* out = static_cast<T*>(copy) + at;
    if constexpr (sizeof(T) == 2) {
      if (packed) {
        union {
          T e[4];
          uint2 bits;
        } pack;
#pragma unroll
        for (int j = 0; j < 4; ++j) pack.e[j] = from_float<T>(w[j]);
        *reinterpret_cast<uint2*>(out) = pack.bits;
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = from_float<T>(w[j]);
  }
  __device__ void copy(void* copy, int64_t i, float w) const { static_cast<T*>(copy)[i] = from_float<T>(w); }
};

// One block per chunk, running the program's threads. The scalars are copied once (the weights'
// stores could otherwise alias them for the compiler, which would then reload them per element).
template <bool kAdamW, class G, class T>
__global__ void __launch_bounds__(kThreads)
    update_chunks_kernel(const UpdateChunk* __restrict__ chunks, const MultiTensorScalars* __restrict__ scalars) {
  const MultiTensorScalars s = *scalars;
  update_chunk<kAdamW>(chunks[blockIdx.x], threadIdx.x, blockDim.x, s, DeviceUpdateMemory<G, T>{});
}

template <bool kAdamW>
void launch_update_chunks(const UpdateChunk* chunks, int64_t count, const MultiTensorScalars* scalars, DType copy_type,
                          DType grad_type, cudaStream_t stream) {
  // Copies of f32: none, the masters are the model's weights.
  with_float_type(grad_type, [&](auto grad) {
    with_float_type(copy_type, [&](auto copy) {
      using G = typename decltype(grad)::type;
      using T = typename decltype(copy)::type;
      update_chunks_kernel<kAdamW, G, T><<<unsigned(count), kThreads, 0, stream>>>(chunks, scalars);
    });
  });
}

}  // namespace

void norm_partials(const void* x, DType type, int64_t blocks, double* partials, void* stream) {
  if (blocks <= 0) return;
  // Two blocks per warp, 16 warps (32 blocks) per 512-thread CUDA block.
  constexpr int threads = 512;
  const int64_t grid = (blocks + threads / kSquareLanes - 1) / (threads / kSquareLanes);
  with_float_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_partials_kernel<<<unsigned(grid < 65535 * 8 ? grid : 65535 * 8), threads, 0,
                           static_cast<cudaStream_t>(stream)>>>(static_cast<const T*>(x), blocks, partials);
  });
  check_launch("norm_partials");
}

void accumulate_gradients(void* sum, const void* micro, DType type, int64_t n, void* stream) {
  if (n <= 0) return;
  with_float_type(type, [&](auto tag) {
    accumulate<typename decltype(tag)::type>(sum, micro, n, static_cast<cudaStream_t>(stream));
  });
}

void decide_update(const double* partials, int64_t count, double* chunk_sums, MultiTensorScalars* scalars,
                   void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = norm_chunks(count);
  if (chunks > 0) norm_chunk_sums_kernel<<<blocks_for(chunks), kThreads, 0, s>>>(partials, count, chunk_sums);
  decide_update_kernel<<<1, 32, 0, s>>>(chunk_sums, chunks, scalars);
  check_launch("decide_update");
}

void update_chunks(const UpdateChunk* chunks, int64_t count, bool adamw, const MultiTensorScalars* scalars,
                   DType copy_type, DType grad_type, void* stream) {
  if (count <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (adamw)
    launch_update_chunks<true>(chunks, count, scalars, copy_type, grad_type, s);
  else
    launch_update_chunks<false>(chunks, count, scalars, copy_type, grad_type, s);
  check_launch("update_chunks");
}

}  // namespace engine::cuda
