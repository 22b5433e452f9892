// Row-major single-precision GEMM through oneDNN: C = alpha * op(A) * op(B) + beta * C.
// transa/transb are 'N' or 'T'; lda, ldb, ldc are the row strides of A, B and C as stored.
//
// The result does not depend on the thread count. oneDNN's AVX-512 and AMX sgemm give each element
// the same bits however they split C among threads; its AVX2 sgemm does not (a tile's edge kernels
// and, for a long k, a split sum follow the partition). So on AVX2 (a CPU without AVX-512, or
// ONEDNN_MAX_CPU_ISA capping it) C is cut into tiles by its shape alone (about kGemmTiles, at least
// kGemmTileRows x kGemmTileCols each), the tiles are shared among the threads, and
// each tile is one single-threaded oneDNN call: every element is computed by one thread in an order
// the shapes set, at 1 thread as at 16 (tests/train/thread_count_test.cpp runs both ISAs). The
// tiles cost AVX2 runs some speed (each call packs its own panels): docs/threads.md has the figure.
#pragma once

#include <cstdint>

namespace engine::ops {

inline constexpr int64_t kGemmTileRows = 128, kGemmTileCols = 256, kGemmTiles = 16;

void sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace engine::ops
