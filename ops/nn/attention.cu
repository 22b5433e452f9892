// causal_attention's CUDA kernels (nn/attention.h): fp32, flash-style, the T x T matrix never stored.
// The tile math is nn/attention_math.h, shared with the CPU emulation that tests it.
//
// Forward: one block of 256 threads per (batch x head, 64 queries). It keeps its q tile in shared
// memory and walks the key tiles up to the diagonal, with an online softmax: per tile S = Q K^T
// (each thread a 4 x 4 piece), the row max and sum combined over the row's 16 threads by shuffles,
// P to shared memory, then the running output rescaled and O += P V (the v tile loaded into the
// buffer the k tile used). It writes out = O / sum and lse = max + log(sum).
//
// Backward, three kernels on the stream, none with atomics:
//   delta   one warp per (batch, time, head): delta = dO . out, into the workspace.
//   dq      one block per (batch x head, 64 queries), keys up to the diagonal:
//           P = exp(S - lse), dS = P (dO V^T - delta), dQ = dS K / sqrt(hd), written once.
//   dk, dv  one block per (batch x kv head, 64 keys): the group's query heads in order, each its
//           query tiles from the diagonal on, dV += P^T dO and dK += dS^T Q / sqrt(hd) summed in
//           registers in that fixed order, written once.
// Head sizes up to 128, compiled at capacities 16, 32, 64 and 128 (zero-padded tiles); dynamic
// shared memory, its limit raised once per kernel and device.
//
// bf16/fp16 nodes that cuDNN's fused SDPA takes (nn/attention_cudnn.h, cudnn_attention_supports)
// go there on their 16-bit values; the executor converts every other node's values to f32 for
// these kernels.
#include <atomic>
#include <cmath>
#include <string>

#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/attention_cudnn.h"
#include "nn/attention_math.h"

namespace engine::cuda {

namespace {

namespace at = engine::ops::attention_tiles;
using at::kPer;
using at::kScoreStride;
using at::kSide;
using at::kTile;
using at::owned;

using at::Geometry;

Geometry geometry(const Shape& qkv, const Node& node) {
  const int64_t h = node.attrs.ints[0], kv = node.attrs.ints[1], hd = qkv[2] / (h + 2 * kv);
  return {qkv[0], qkv[1], h, kv, hd, qkv[2], h * hd};
}

__device__ inline float row_max(float v) {
#pragma unroll
  for (int m = kSide / 2; m >= 1; m /= 2) v = at::combine_max(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
__device__ inline float row_sum(float v) {
#pragma unroll
  for (int m = kSide / 2; m >= 1; m /= 2) v = at::combine_sum(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

template <int kCap>
constexpr size_t forward_smem() {  // q, k-then-v, P
  return sizeof(float) * (2 * kTile * at::tile_stride(kCap) + kTile * kScoreStride);
}
template <int kCap>
constexpr size_t dq_smem() {  // q, dO, k, v, dS
  return sizeof(float) * (4 * kTile * at::tile_stride(kCap) + kTile * kScoreStride);
}
template <int kCap>
constexpr size_t dkv_smem() {  // k, v, q, dO, P, dS, lse, delta
  return sizeof(float) * (4 * kTile * at::tile_stride(kCap) + 2 * kTile * kScoreStride + 2 * kTile);
}

template <int kCap>
__global__ void __launch_bounds__(at::kThreads) forward_kernel(const float* __restrict__ qkv, float* __restrict__ out,
                                                               float* __restrict__ lse, Geometry g, float scale) {
  extern __shared__ float smem[];
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  float* sq = smem;
  float* skv = sq + kTile * ld;
  float* sp = skv + kTile * ld;
  const int64_t blocks = at::tiles(g.time), qb = blocks - 1 - blockIdx.y;  // the costliest first
  const int64_t b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, kvh = h / g.group();
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide, hd = int(g.head_size);
  const int64_t q0 = qb * kTile;
  const float* base = qkv + b * g.time * g.row;
  at::load_tile<kCap>(sq, base + q0 * g.row + h * g.head_size, g.row, at::tile_rows(g.time, q0), hd, tid);

  float run_max[kPer], run_sum[kPer], acc[kPer][kCols];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    run_max[i] = -INFINITY;
    run_sum[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[i][k] = 0.0f;
  }
  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = kb * kTile;
    const int valid = at::tile_rows(g.time, k0);
    __syncthreads();  // the previous tile's P V is done with skv and sp
    at::load_tile<kCap>(skv, base + k0 * g.row + g.k(kvh), g.row, valid, hd, tid);
    __syncthreads();
    float s[kPer][kPer], rescale[kPer];
    at::dot_tile<kCap>(sq, skv, ty, tx, s);
    at::forward_scores(s, scale, q0, k0, g.time, ty, tx);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      float partial;
      rescale[i] = at::softmax_step(s, i, row_max(at::partial_max(s, i)), run_max[i], partial);
      run_sum[i] = run_sum[i] * rescale[i] + row_sum(partial);
#pragma unroll
      for (int j = 0; j < kPer; ++j) sp[owned(ty, i) * kScoreStride + owned(tx, j)] = s[i][j];
    }
    __syncthreads();  // every S is done with the k tile, and P is in place
    at::load_tile<kCap>(skv, base + k0 * g.row + g.v(kvh), g.row, valid, hd, tid);
    __syncthreads();
    at::rescale_rows(acc, rescale);
    at::product_tile<kCap>(sp, skv, ty, tx, acc);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = q0 + owned(ty, i);
    if (t >= g.time) continue;
    const float inv = at::row_inverse(run_sum[i]);
    float* o = out + (b * g.time + t) * g.channels + h * g.head_size;
#pragma unroll
    for (int k = 0; k < kCols; ++k)
      if (owned(tx, k) < hd) o[owned(tx, k)] = acc[i][k] * inv;
    if (tx == 0) lse[(b * g.heads + h) * g.time + t] = at::row_lse(run_max[i], run_sum[i]);
  }
}

// delta (B, H, T) = dO . out per row, one warp per (batch, time, head).
__global__ void delta_kernel(const float* __restrict__ dout, const float* __restrict__ out, float* __restrict__ delta,
                             Geometry g) {
  const int64_t rows = g.batch * g.time * g.heads;
  const int lane = threadIdx.x % 32;
  for (int64_t r = thread_index() / 32; r < rows; r += thread_stride() / 32) {  // r = (b T + t) H + h
    const int64_t h = r % g.heads, bt = r / g.heads, b = bt / g.time, t = bt % g.time;
    const int64_t at_row = bt * g.channels + h * g.head_size;
    float v = at::delta_partial(dout + at_row, out + at_row, int(g.head_size), lane);
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) v = at::combine_sum(v, __shfl_xor_sync(0xffffffffu, v, m));
    if (lane == 0) delta[(b * g.heads + h) * g.time + t] = v;
  }
}

template <int kCap>
__global__ void __launch_bounds__(at::kThreads)
    dq_kernel(const float* __restrict__ dout, const float* __restrict__ qkv, const float* __restrict__ lse,
              const float* __restrict__ delta, float* __restrict__ dqkv, Geometry g, float scale, bool accumulate) {
  extern __shared__ float smem[];
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  float* sq = smem;
  float* sdo = sq + kTile * ld;
  float* sk = sdo + kTile * ld;
  float* sv = sk + kTile * ld;
  float* sds = sv + kTile * ld;
  const int64_t blocks = at::tiles(g.time), qb = blocks - 1 - blockIdx.y;
  const int64_t b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, kvh = h / g.group();
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide, hd = int(g.head_size);
  const int64_t q0 = qb * kTile;
  const int q_valid = at::tile_rows(g.time, q0);
  const float* base = qkv + b * g.time * g.row;
  at::load_tile<kCap>(sq, base + q0 * g.row + h * g.head_size, g.row, q_valid, hd, tid);
  at::load_tile<kCap>(sdo, dout + (b * g.time + q0) * g.channels + h * g.head_size, g.channels, q_valid, hd, tid);
  float row_lse[kPer], row_delta[kPer], acc[kPer][kCols];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = q0 + owned(ty, i), at_row = (b * g.heads + h) * g.time + t;
    row_lse[i] = t < g.time ? lse[at_row] : 0.0f;
    row_delta[i] = t < g.time ? delta[at_row] : 0.0f;
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[i][k] = 0.0f;
  }
  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t k0 = kb * kTile;
    const int valid = at::tile_rows(g.time, k0);
    __syncthreads();  // the previous dS K is done with sk and sds
    at::load_tile<kCap>(sk, base + k0 * g.row + g.k(kvh), g.row, valid, hd, tid);
    at::load_tile<kCap>(sv, base + k0 * g.row + g.v(kvh), g.row, valid, hd, tid);
    __syncthreads();
    float s[kPer][kPer], dp[kPer][kPer];
    at::dot_tile<kCap>(sq, sk, ty, tx, s);
    at::dot_tile<kCap>(sdo, sv, ty, tx, dp);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float p =
            at::probability(s[i][j], scale, row_lse[i], at::visible(q0 + owned(ty, i), k0 + owned(tx, j), g.time));
        sds[owned(ty, i) * kScoreStride + owned(tx, j)] = at::score_gradient(p, dp[i][j], row_delta[i]);
      }
    __syncthreads();
    at::product_tile<kCap>(sds, sk, ty, tx, acc);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = q0 + owned(ty, i);
    if (t >= g.time) continue;
    float* dq = dqkv + (b * g.time + t) * g.row + h * g.head_size;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      if (owned(tx, k) >= hd) continue;
      const float v = acc[i][k] * scale;
      dq[owned(tx, k)] = accumulate ? dq[owned(tx, k)] + v : v;
    }
  }
}

template <int kCap>
__global__ void __launch_bounds__(at::kThreads)
    dkv_kernel(const float* __restrict__ dout, const float* __restrict__ qkv, const float* __restrict__ lse,
               const float* __restrict__ delta, float* __restrict__ dqkv, Geometry g, float scale, bool accumulate) {
  extern __shared__ float smem[];
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  float* sk = smem;
  float* sv = sk + kTile * ld;
  float* sq = sv + kTile * ld;
  float* sdo = sq + kTile * ld;
  float* sp = sdo + kTile * ld;
  float* sds = sp + kTile * kScoreStride;
  float* slse = sds + kTile * kScoreStride;
  float* sdelta = slse + kTile;
  const int64_t blocks = at::tiles(g.time), kb = blockIdx.y;  // key tile 0 has the most queries: first
  const int64_t b = blockIdx.x / g.kv_heads, kvh = blockIdx.x % g.kv_heads;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide, hd = int(g.head_size);
  const int64_t k0 = kb * kTile;
  const float* base = qkv + b * g.time * g.row;
  const int k_valid = at::tile_rows(g.time, k0);
  at::load_tile<kCap>(sk, base + k0 * g.row + g.k(kvh), g.row, k_valid, hd, tid);
  at::load_tile<kCap>(sv, base + k0 * g.row + g.v(kvh), g.row, k_valid, hd, tid);
  float dk[kPer][kCols], dv[kPer][kCols];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
#pragma unroll
    for (int k = 0; k < kCols; ++k) dk[i][k] = dv[i][k] = 0.0f;
  for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    for (int64_t qb = kb; qb < blocks; ++qb) {
      const int64_t q0 = qb * kTile;
      const int valid = at::tile_rows(g.time, q0);
      __syncthreads();  // the previous products are done with sq, sdo, sp, sds
      at::load_tile<kCap>(sq, base + q0 * g.row + h * g.head_size, g.row, valid, hd, tid);
      at::load_tile<kCap>(sdo, dout + (b * g.time + q0) * g.channels + h * g.head_size, g.channels, valid, hd, tid);
      if (tid < kTile) {
        const int64_t at_row = (b * g.heads + h) * g.time + q0 + tid;
        slse[tid] = tid < valid ? lse[at_row] : 0.0f;
        sdelta[tid] = tid < valid ? delta[at_row] : 0.0f;
      }
      __syncthreads();
      // Transposed tiles: rows are keys (ty), columns queries (tx).
      float s[kPer][kPer], dp[kPer][kPer];
      at::dot_tile<kCap>(sk, sq, ty, tx, s);
      at::dot_tile<kCap>(sv, sdo, ty, tx, dp);
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const int query = owned(tx, j), idx = owned(ty, i) * kScoreStride + query;
          const float p =
              at::probability(s[i][j], scale, slse[query], at::visible(q0 + query, k0 + owned(ty, i), g.time));
          sp[idx] = p;
          sds[idx] = at::score_gradient(p, dp[i][j], sdelta[query]);
        }
      __syncthreads();
      at::product_tile<kCap>(sp, sdo, ty, tx, dv);
      at::product_tile<kCap>(sds, sq, ty, tx, dk);
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = k0 + owned(ty, i);
    if (t >= g.time) continue;
    float* row = dqkv + (b * g.time + t) * g.row;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int c = owned(tx, k);
      if (c >= hd) continue;
      const float gk = dk[i][k] * scale, gv = dv[i][k];
      float* pk = row + g.k(kvh) + c;
      float* pv = row + g.v(kvh) + c;
      *pk = accumulate ? *pk + gk : gk;
      *pv = accumulate ? *pv + gv : gv;
    }
  }
}

// Raises a kernel's dynamic shared memory limit on the current device, once per device.
template <typename KernelFn>
void allow_shared(KernelFn kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  int most = 0;  // an sm_86/89 card allows 99 KiB a block, an H100 227 KiB
  check(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  if (size_t(most) < bytes)
    throw UserError("causal_attention in fp32 at this head size needs " + std::to_string(bytes >> 10) +
                    " KiB of shared memory a block, and this GPU allows " + std::to_string(most >> 10) +
                    " KiB: use precision.mode bf16 or fp16 (cuDNN's attention), or a head size of 64 or less");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "attention: cudaFuncSetAttribute");
  done.fetch_or(bit, std::memory_order_acq_rel);
}

void check_f32(const KernelContext& ctx, std::initializer_list<ValueId> ids) {
  for (ValueId id : ids)
    if (ctx.dtype(id) != DType::f32) throw InternalError("causal_attention's CUDA kernels take f32 values only");
}

Geometry checked_geometry(const KernelContext& ctx, const Node& node, ValueId qkv) {
  const Geometry g = geometry(ctx.shape(qkv), node);
  if (at::head_capacity(g.head_size) == 0)
    throw UserError("causal_attention on CUDA: head size " + std::to_string(g.head_size) + " is over " +
                    std::to_string(at::kMaxHeadSize));
  if (g.batch * g.heads > int64_t(INT32_MAX) || at::tiles(g.time) > 65535)
    throw UserError("causal_attention on CUDA: batch x heads or the sequence length is too large for one launch");
  return g;
}

template <int kCap>
void forward(const Geometry& g, const float* qkv, float* out, float* lse, float scale, cudaStream_t stream) {
  static std::atomic<uint64_t> done{0};
  allow_shared(forward_kernel<kCap>, forward_smem<kCap>(), done);
  const dim3 grid(unsigned(g.batch * g.heads), unsigned(at::tiles(g.time)));
  forward_kernel<kCap><<<grid, at::kThreads, forward_smem<kCap>(), stream>>>(qkv, out, lse, g, scale);
  check_launch("causal_attention forward");
}

template <int kCap>
void backward(const Geometry& g, const float* dout, const float* qkv, const float* lse, const float* delta, float* dqkv,
              float scale, bool accumulate, cudaStream_t stream) {
  static std::atomic<uint64_t> dq_done{0}, dkv_done{0};
  allow_shared(dq_kernel<kCap>, dq_smem<kCap>(), dq_done);
  allow_shared(dkv_kernel<kCap>, dkv_smem<kCap>(), dkv_done);
  const dim3 dq_grid(unsigned(g.batch * g.heads), unsigned(at::tiles(g.time)));
  dq_kernel<kCap>
      <<<dq_grid, at::kThreads, dq_smem<kCap>(), stream>>>(dout, qkv, lse, delta, dqkv, g, scale, accumulate);
  check_launch("causal_attention backward (dq)");
  const dim3 dkv_grid(unsigned(g.batch * g.kv_heads), unsigned(at::tiles(g.time)));
  dkv_kernel<kCap>
      <<<dkv_grid, at::kThreads, dkv_smem<kCap>(), stream>>>(dout, qkv, lse, delta, dqkv, g, scale, accumulate);
  check_launch("causal_attention backward (dk, dv)");
}

// cuDNN when it takes the node and the executor handed over its 16-bit values as they are (it
// skips conversion for such nodes); the fp32 kernels when the values are f32.
bool on_cudnn(const Node& node, const KernelContext& ctx, ValueId qkv) {
  return ctx.dtype(qkv) != DType::f32 && cudnn_attention_supports(*ctx.graph, node);
}

}  // namespace

// inputs qkv; outputs out (B, T, H hd), lse (B, H, T)
void attention(const Node& node, const KernelContext& ctx) {
  if (on_cudnn(node, ctx, node.inputs[0])) return cudnn_attention_forward(node, ctx);
  const ValueId qkv_id = node.inputs[0], out_id = node.outputs[0], lse_id = node.outputs[1];
  check_f32(ctx, {qkv_id, out_id, lse_id});
  const Geometry g = checked_geometry(ctx, node, qkv_id);
  if (g.batch * g.time == 0) return;
  const float scale = 1.0f / std::sqrt(float(g.head_size));
  const float* qkv = ctx.f32(qkv_id);
  float* out = ctx.f32(out_id);
  float* lse = ctx.f32(lse_id);
  switch (at::head_capacity(g.head_size)) {
    case 16:
      return forward<16>(g, qkv, out, lse, scale, stream(ctx));
    case 32:
      return forward<32>(g, qkv, out, lse, scale, stream(ctx));
    case 64:
      return forward<64>(g, qkv, out, lse, scale, stream(ctx));
    default:
      return forward<128>(g, qkv, out, lse, scale, stream(ctx));
  }
}

// inputs dout, qkv, out, lse; output dqkv (added to when the node accumulates). delta = dO . out
// goes to the workspace (B H T floats).
void attention_backward(const Node& node, const KernelContext& ctx) {
  const ValueId dout_id = node.inputs[0], qkv_id = node.inputs[1], out_id = node.inputs[2], lse_id = node.inputs[3];
  const ValueId dqkv_id = node.outputs[0];
  if (on_cudnn(node, ctx, qkv_id)) return cudnn_attention_backward(node, ctx);
  check_f32(ctx, {dout_id, qkv_id, out_id, lse_id, dqkv_id});
  const Geometry g = checked_geometry(ctx, node, qkv_id);
  if (g.batch * g.time == 0) return;
  const size_t delta_bytes = sizeof(float) * size_t(g.batch * g.heads * g.time);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < delta_bytes)
    throw InternalError("causal_attention backward on CUDA needs " + std::to_string(delta_bytes) +
                        " bytes of workspace, has " + std::to_string(ctx.workspace_bytes));
  const float scale = 1.0f / std::sqrt(float(g.head_size));
  const bool accumulate = ctx.accumulates(node, 0);
  const float* dout = ctx.f32(dout_id);
  const float* qkv = ctx.f32(qkv_id);
  const float* lse = ctx.f32(lse_id);
  float* dqkv = ctx.f32(dqkv_id);
  float* delta = static_cast<float*>(ctx.workspace);
  const cudaStream_t s = stream(ctx);
  const int64_t rows = g.batch * g.time * g.heads;
  delta_kernel<<<blocks_for(rows * 32), kThreads, 0, s>>>(dout, ctx.f32(out_id), delta, g);
  check_launch("causal_attention backward (delta)");
  switch (at::head_capacity(g.head_size)) {
    case 16:
      return backward<16>(g, dout, qkv, lse, delta, dqkv, scale, accumulate, s);
    case 32:
      return backward<32>(g, dout, qkv, lse, delta, dqkv, scale, accumulate, s);
    case 64:
      return backward<64>(g, dout, qkv, lse, delta, dqkv, scale, accumulate, s);
    default:
      return backward<128>(g, dout, qkv, lse, delta, dqkv, scale, accumulate, s);
  }
}

}  // namespace engine::cuda
