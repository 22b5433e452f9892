// The tile math of causal_attention's CUDA kernels (nn/attention.cu), written once for the device
// and for the CPU emulation that tests it (tests/ops/attention_cuda_math_test.cpp).
//
// A block of 256 threads works on 64 x 64 tiles: thread (ty, tx) = (tid / 16, tid % 16) owns rows
// ty + 16 i and columns tx + 16 j (i, j < 4) of a score tile, and columns tx + 16 k of the head
// (k < capacity / 16) of an output tile. Tiles of q, k, v, dO in shared memory are 64 rows of
// `capacity` floats (the head size rounded up to 16, 32, 64 or 128, zero beyond it), one float of
// padding per row so that 16 threads reading 16 rows at one column hit 16 banks. Products use
// explicit fmaf (the CUDA sources build with -fmad=false), so a CPU loop over the threads calling
// these functions computes the same sums in the same order; only expf and logf may differ by an ulp.
//
// Row reductions of a score tile (its max and sum) combine the 16 threads of a row in a butterfly,
// lane ^ 8, 4, 2, 1 (warp shuffles on the device, a loop in the emulation), each lane combining its
// value with its partner's (combine_max, combine_sum), so every lane of the row ends with the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

// Loop unrolling hints for nvcc's device pass; nothing for host compilers (-Wunknown-pragmas).
#if defined(__CUDA_ARCH__)
#define ATTENTION_PRAGMA(x) _Pragma(#x)
#define ATTENTION_UNROLL ATTENTION_PRAGMA(unroll)
#define ATTENTION_UNROLL_BY(n) ATTENTION_PRAGMA(unroll n)
#else
#define ATTENTION_UNROLL
#define ATTENTION_UNROLL_BY(n)
#endif

namespace engine::ops::attention_tiles {

inline constexpr int kTile = 64;                // queries (and keys) of a tile
inline constexpr int kSide = 16;                // threads along each side of the thread grid
inline constexpr int kThreads = kSide * kSide;  // 256 per block
inline constexpr int kPer = kTile / kSide;      // rows (and columns) of a score tile per thread
inline constexpr int kScoreStride = kTile + 1;  // floats between rows of a score tile in shared memory
inline constexpr int kMaxHeadSize = 128;

// The packed qkv layout (nn/qkv_layout.h): a row of (H + 2 KV) hd floats, query head h at h hd,
// its key head g = h / (H / KV) at H hd + g hd and value head at (H + KV) hd + g hd.
struct Geometry {
  int64_t batch, time, heads, kv_heads, head_size, row, channels;  // channels = H hd, out's width
  ENGINE_HOST_DEVICE int64_t group() const { return heads / kv_heads; }
  ENGINE_HOST_DEVICE int64_t q(int64_t h) const { return h * head_size; }
  ENGINE_HOST_DEVICE int64_t k(int64_t g) const { return channels + g * head_size; }
  ENGINE_HOST_DEVICE int64_t v(int64_t g) const { return channels + kv_heads * head_size + g * head_size; }
};

// The compiled head capacity that holds a head of `hd`: 16, 32, 64 or 128 (0 when none does).
ENGINE_HOST_DEVICE constexpr int head_capacity(int64_t hd) {
  return hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 0;
}
// Floats between rows of a q, k, v or dO tile of `capacity` columns.
ENGINE_HOST_DEVICE constexpr int tile_stride(int capacity) { return capacity + 1; }
// The i-th row (or column) a thread at `index` along a side owns.
ENGINE_HOST_DEVICE constexpr int owned(int index, int i) { return index + kSide * i; }
// Blocks of kTile rows over `rows`.
ENGINE_HOST_DEVICE constexpr int64_t tiles(int64_t rows) { return (rows + kTile - 1) / kTile; }

// Rows of the tile from `first` on: kTile, or what is left of `time`.
ENGINE_HOST_DEVICE constexpr int tile_rows(int64_t time, int64_t first) {
  return time - first < kTile ? int(time - first) : kTile;
}

// Whether a query sees a key: causal, and the query a real row (key <= query < T puts key < T).
ENGINE_HOST_DEVICE constexpr bool visible(int64_t query, int64_t key, int64_t time) {
  return key <= query && query < time;
}

// Thread `thread`'s share of loading a tile: rows [0, valid) of `hd` floats from `src` (rows
// `stride` floats apart) into `tile`, zero in rows past `valid` and columns past `hd`.
template <int kCap>
ENGINE_HOST_DEVICE inline void load_tile(float* tile, const float* src, int64_t stride, int valid, int hd, int thread) {
  constexpr int ld = tile_stride(kCap);
  ATTENTION_UNROLL_BY(4)
  for (int e = thread; e < kTile * kCap; e += kThreads) {
    const int r = e / kCap, c = e % kCap;
    tile[r * ld + c] = r < valid && c < hd ? src[int64_t(r) * stride + c] : 0.0f;
  }
}

// acc[i][j] = sum_d a[row ty + 16 i][d] b[row tx + 16 j][d] over the tile's capacity, d ascending.
template <int kCap>
ENGINE_HOST_DEVICE inline void dot_tile(const float* a, const float* b, int ty, int tx, float (&acc)[kPer][kPer]) {
  constexpr int ld = tile_stride(kCap);
  ATTENTION_UNROLL
  for (int i = 0; i < kPer; ++i) ATTENTION_UNROLL
  for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;
  ATTENTION_UNROLL_BY(8)
  for (int d = 0; d < kCap; ++d) {
    float av[kPer], bv[kPer];
    ATTENTION_UNROLL
    for (int i = 0; i < kPer; ++i) {
      av[i] = a[owned(ty, i) * ld + d];
      bv[i] = b[owned(tx, i) * ld + d];
    }
    ATTENTION_UNROLL
    for (int i = 0; i < kPer; ++i) ATTENTION_UNROLL
    for (int j = 0; j < kPer; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

// acc[i][k] += sum_j p[row ty + 16 i][j] v[row j][column tx + 16 k], j ascending over the tile: a
// score tile (kScoreStride apart) times a q, k, v or dO tile.
template <int kCap>
ENGINE_HOST_DEVICE inline void product_tile(const float* p, const float* v, int ty, int tx,
                                            float (&acc)[kPer][kCap / kSide]) {
  constexpr int ld = tile_stride(kCap), cols = kCap / kSide;
  ATTENTION_UNROLL_BY(4)
  for (int j = 0; j < kTile; ++j) {
    float pv[kPer], vv[cols];
    ATTENTION_UNROLL
    for (int i = 0; i < kPer; ++i) pv[i] = p[owned(ty, i) * kScoreStride + j];
    ATTENTION_UNROLL
    for (int k = 0; k < cols; ++k) vv[k] = v[j * ld + owned(tx, k)];
    ATTENTION_UNROLL
    for (int i = 0; i < kPer; ++i) ATTENTION_UNROLL
    for (int k = 0; k < cols; ++k) acc[i][k] = fmaf(pv[i], vv[k], acc[i][k]);
  }
}

// Forward: a thread's dot products to scaled scores, -infinity where the query does not see the key.
ENGINE_HOST_DEVICE inline void forward_scores(float (&s)[kPer][kPer], float scale, int64_t q0, int64_t k0, int64_t time,
                                              int ty, int tx) {
  ATTENTION_UNROLL
  for (int i = 0; i < kPer; ++i) ATTENTION_UNROLL
  for (int j = 0; j < kPer; ++j)
    s[i][j] = visible(q0 + owned(ty, i), k0 + owned(tx, j), time) ? s[i][j] * scale : -INFINITY;
}

ENGINE_HOST_DEVICE inline float combine_max(float a, float b) { return a > b ? a : b; }
ENGINE_HOST_DEVICE inline float combine_sum(float a, float b) { return a + b; }

// The largest of a thread's scores in row i.
ENGINE_HOST_DEVICE inline float partial_max(const float (&s)[kPer][kPer], int i) {
  float m = s[i][0];
  ATTENTION_UNROLL
  for (int j = 1; j < kPer; ++j) m = combine_max(m, s[i][j]);
  return m;
}

// One key tile of the online softmax for row i, given the row's max over the tile (`tile_max`, the
// combined partial maxima): the new running max in `max`, returns the factor the row's running sum
// and output rescale by, and turns the thread's scores into exp(s - max), their sum in `partial`.
ENGINE_HOST_DEVICE inline float softmax_step(float (&s)[kPer][kPer], int i, float tile_max, float& running_max,
                                             float& partial) {
  const float top = combine_max(running_max, tile_max);
  // A row that has seen no key yet (only padding rows past T stay so) keeps max -infinity.
  const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - top);
  partial = 0.0f;
  ATTENTION_UNROLL
  for (int j = 0; j < kPer; ++j) {
    s[i][j] = s[i][j] == -INFINITY ? 0.0f : expf(s[i][j] - top);
    partial = combine_sum(partial, s[i][j]);
  }
  running_max = top;
  return rescale;
}

// acc[i][*] *= rescale[i]: the running output of a row when its max grows.
template <int kCols>
ENGINE_HOST_DEVICE inline void rescale_rows(float (&acc)[kPer][kCols], const float (&rescale)[kPer]) {
  ATTENTION_UNROLL
  for (int i = 0; i < kPer; ++i) ATTENTION_UNROLL
  for (int k = 0; k < kCols; ++k) acc[i][k] *= rescale[i];
}

// The forward's results of a row from its running max and sum: the log-sum-exp (natural log), and
// the factor its output multiplies by (1 / sum, as the CPU kernel divides).
ENGINE_HOST_DEVICE inline float row_lse(float max, float sum) { return max + logf(sum); }
ENGINE_HOST_DEVICE inline float row_inverse(float sum) { return 1.0f / sum; }

// Backward: the probability p = exp(score - lse) of a dot product (0 where not visible), and the
// score gradient ds = p (dp - delta).
ENGINE_HOST_DEVICE inline float probability(float dot, float scale, float lse, bool seen) {
  return seen ? expf(dot * scale - lse) : 0.0f;
}
ENGINE_HOST_DEVICE inline float score_gradient(float p, float dp, float delta) { return p * (dp - delta); }

// delta = dO . out of one row, as 32 lanes sum it: lane l's share (columns l, l + 32, ...), then
// combined with combine_sum in a butterfly (lane ^ 16, 8, 4, 2, 1).
ENGINE_HOST_DEVICE inline float delta_partial(const float* dout, const float* out, int hd, int lane) {
  float sum = 0.0f;
  for (int c = lane; c < hd; c += 32) sum = fmaf(dout[c], out[c], sum);
  return sum;
}

}  // namespace engine::ops::attention_tiles
