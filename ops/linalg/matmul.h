// matmul: batched matrix product with optional transposes, C[b] = op(A[b]) op(B[b]).
//
//   A (..., M, K) or (..., K, M) with transpose_a;  B (..., K, N) or (..., N, K) with transpose_b;
//   the leading (batch) dimensions must be equal  ->  C (..., M, N)
//
// Backward (through matmul itself): dA = dC op(B)^T and dB = op(A)^T dC, with the transposes
// arranged so each is one more matmul.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId matmul(Graph& g, ValueId a, ValueId b, bool transpose_a, bool transpose_b, const std::string& name);

extern const OpDef kMatmul;

}  // namespace engine::ops
