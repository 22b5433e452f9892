// CUDA kernel of transpose (shape/transpose.cpp): y (..., N, M) (+)= x (..., M, N) swapped, f32.
// 32 x 32 tiles through shared memory, so both the reads of x and the writes of y are coalesced.
#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

constexpr int kTile = 32, kRows = 8;  // a tile, and the rows of threads that walk it

// x (batch, m, n) -> y (batch, n, m); grid-stride over the tiles of all matrices.
__global__ void transpose_kernel(const float* x, float* y, int64_t batch, int64_t m, int64_t n, bool accumulate) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the column reads
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const int64_t tiles = batch * tiles_m * tiles_n;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / (tiles_m * tiles_n), rest = t % (tiles_m * tiles_n);
    const int64_t i0 = (rest / tiles_n) * kTile, j0 = (rest % tiles_n) * kTile;
    const float* xb = x + b * m * n;
    float* yb = y + b * m * n;
    for (int r = threadIdx.y; r < kTile; r += kRows) {
      const int64_t i = i0 + r, j = j0 + threadIdx.x;
      if (i < m && j < n) tile[r][threadIdx.x] = xb[i * n + j];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kRows) {
      const int64_t j = j0 + r, i = i0 + threadIdx.x;  // y[j][i] = x[i][j]
      if (i < m && j < n) {
        const float v = tile[threadIdx.x][r];
        yb[j * m + i] = accumulate ? yb[j * m + i] + v : v;
      }
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
}

}  // namespace

void transpose(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t m = s[s.rank() - 2], n = s.last();
  if (m * n == 0) return;
  const int64_t batch = s.numel() / (m * n);
  const int64_t tiles = batch * ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  const unsigned blocks = unsigned(tiles < 65535 * 8 ? tiles : 65535 * 8);
  transpose_kernel<<<blocks, dim3(kTile, kRows), 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]),
                                                                   batch, m, n, ctx.accumulates(node, 0));
  check_launch("transpose");
}

}  // namespace engine::cuda
