#include "linalg/gemm.h"

#include <dnnl.h>

#include "core/error.h"

namespace engine::ops {

void sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_status_t status = dnnl_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  ENGINE_CHECK(status == dnnl_success, "dnnl_sgemm failed with status " + std::to_string(int(status)));
}

}  // namespace engine::ops
