// Row-major single-precision GEMM through oneDNN: C = alpha * op(A) * op(B) + beta * C.
// transa/transb are 'N' or 'T'; lda, ldb, ldc are the row strides of A, B and C as stored.
#pragma once

#include <cstdint>

namespace engine::ops {

void sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace engine::ops
