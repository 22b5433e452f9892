#include "linalg/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/cpu_isa.h"
#include "core/error.h"

namespace engine::ops {
namespace {

// One oneDNN call; single-threaded wherever it is made inside a parallel region or with one thread.
void onednn_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_status_t status = dnnl_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  ENGINE_CHECK(status == dnnl_success, "dnnl_sgemm failed with status " + std::to_string(int(status)));
}

}  // namespace

void sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // oneDNN's AVX-512 (and AMX) sgemm gives every element the same bits however it splits C among
  // threads (measured over odd shapes, both transposes, 1 to 16 threads); its AVX2 sgemm does not.
  // An empty C has no tiles (and no tile size).
  if (kernel_isa() != CpuIsa::avx2 || m == 0 || n == 0)
    return onednn_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // About kGemmTiles tiles, none under the minimum, cut so that the panels the calls pack (each
  // packs its rows of A and its columns of B) add up to the least: rows : columns as m : n.
  const auto round_up = [](int64_t x, int64_t align) { return (x + align - 1) / align * align; };
  const int64_t most_rows = std::max<int64_t>(1, m / kGemmTileRows),
                most_cols = std::max<int64_t>(1, n / kGemmTileCols);
  const auto row_count = std::clamp<int64_t>(
      int64_t(std::lround(std::sqrt(double(kGemmTiles) * double(m) / double(std::max<int64_t>(n, 1))))), 1, most_rows);
  const int64_t col_count = std::clamp<int64_t>((kGemmTiles + row_count - 1) / row_count, 1, most_cols);
  const int64_t tile_rows = round_up((m + row_count - 1) / row_count, 16);
  const int64_t tile_cols = round_up((n + col_count - 1) / col_count, 64);
  const int64_t row_tiles = (m + tile_rows - 1) / tile_rows;
  const int64_t col_tiles = (n + tile_cols - 1) / tile_cols;
  // op(A)'s rows i0.. start at a + i0 * lda ('N') or a + i0 ('T'); op(B)'s columns j0.. at b + j0
  // ('N') or b + j0 * ldb ('T').
  const bool ta = transa == 'T' || transa == 't', tb = transb == 'T' || transb == 't';
  const auto tile = [&](int64_t t) {
    const int64_t i0 = t / col_tiles * tile_rows, j0 = t % col_tiles * tile_cols;
    const int64_t rows = std::min(tile_rows, m - i0), cols = std::min(tile_cols, n - j0);
    onednn_sgemm(transa, transb, rows, cols, k, alpha, ta ? a + i0 : a + i0 * lda, lda, tb ? b + j0 * ldb : b + j0, ldb,
                 beta, c + i0 * ldc + j0, ldc);
  };
  const int64_t tiles = row_tiles * col_tiles;
  if (omp_in_parallel() || omp_get_max_threads() == 1) {  // oneDNN runs one thread here
    for (int64_t t = 0; t < tiles; ++t) tile(t);
    return;
  }
  // An active region even for one tile: inside it oneDNN runs one thread (outside, it would split
  // the tile by the thread count).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) tile(t);
}

}  // namespace engine::ops
