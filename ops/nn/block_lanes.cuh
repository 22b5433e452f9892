// BlockLanes<N> and WarpLanes: the CUDA policies of the row programs (nn/row_programs.h).
//
// BlockLanes<N>: the lanes are the N threads of a block (launch with blockDim.x == N, one row or group of rows per
// block); a phase is the thread's own lane; sum and max combine the lanes in the tree SerialLanes<N> runs on the CPU:
// __shfl_down by 16, 8, 4, 2, 1 within each warp, then the same over the warps' totals in warp 0,
// the total broadcast through shared memory. Each reduction is two __syncthreads(), which also
// order the phases around it.
//
//   __global__ void __launch_bounds__(256) norm_kernel(...) {
//     BlockLanes<256> lanes;
//     norm_forward_row(lanes, x + blockIdx.x * c, c, ...);
//   }
//
// WarpLanes: the lanes are the 32 threads of one warp, so a block runs blockDim.x / 32 rows side by
// side; sum and max are SerialLanes<32>'s tree (__shfl_down by 16, 8, 4, 2, 1), lane 0's total
// broadcast by a shuffle. No shared memory and no __syncthreads(): a warp whose row is past the end
// may return early.
#pragma once

#include <cuda_runtime.h>

#include "nn/row_programs.h"

namespace engine::ops {

// SerialLanes<32>'s tree within one warp: x (+)= the value 16, 8, 4, 2, 1 lanes up; lane 0 ends
// with the warp's total.
template <class T, class Op>
__device__ T warp_tree(T x, Op op) {
  for (int o = 16; o > 0; o /= 2) x = op(x, __shfl_down_sync(0xffffffffu, x, o));
  return x;
}

// What both policies share: a lane's variable is its thread's own, and sum and max are the
// policy's reduce with the row programs' combining steps.
template <class Policy>
struct ThreadLanes {
  template <class T>
  struct Local {
    T value;
    __device__ T& operator[](int) { return value; }
  };
  template <class T>
  __device__ T sum(Local<T>& v) const {
    return static_cast<const Policy*>(this)->reduce(v, RowSum{});
  }
  template <class T>
  __device__ T max(Local<T>& v) const {
    return static_cast<const Policy*>(this)->reduce(v, RowMax{});
  }
};

template <int N>
struct BlockLanes : ThreadLanes<BlockLanes<N>> {
  static_assert(N >= 32 && N <= 1024 && (N & (N - 1)) == 0, "lanes: a power of two from 32 to 1024");
  static constexpr int kCount = N;
  template <class T>
  using Local = typename ThreadLanes<BlockLanes<N>>::template Local<T>;

  template <class F>
  __device__ void each(F&& phase) const {
    phase(int(threadIdx.x));
  }
  __device__ void barrier() const { __syncthreads(); }

  template <class T, class Op>
  __device__ T reduce(Local<T>& v, Op op) const {
    constexpr int groups = N / 32;
    // Slots 0..31 for the warps' totals, slot 32 for the result (apart, so that a thread still
    // reading the last result cannot see the next reduction's totals land on it).
    __shared__ double shared[33];
    T* slots = reinterpret_cast<T*>(shared);
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const T x = warp_tree(v.value, op);
    if (lane == 0) slots[warp] = x;
    __syncthreads();
    if (warp == 0) {
      T t = lane < groups ? slots[lane] : slots[0];
      for (int o = groups / 2; o > 0; o /= 2) t = op(t, __shfl_down_sync(0xffffffffu, t, o));
      if (lane == 0) *reinterpret_cast<T*>(shared + 32) = t;
    }
    __syncthreads();
    return *reinterpret_cast<T*>(shared + 32);
  }
};

struct WarpLanes : ThreadLanes<WarpLanes> {
  static constexpr int kCount = 32;

  template <class F>
  __device__ void each(F&& phase) const {
    phase(int(threadIdx.x) & 31);
  }
  __device__ void barrier() const { __syncwarp(); }

  template <class T, class Op>
  __device__ T reduce(Local<T>& v, Op op) const {
    return __shfl_sync(0xffffffffu, warp_tree(v.value, op), 0);
  }
};

}  // namespace engine::ops
