// 16-bit matrix products through oneDNN's matmul primitive: bf16 (or f16) operands, fp32
// accumulation, the result stored in fp32 or in the operands' type. oneDNN picks AMX or
// AVX512-BF16 kernels where the CPU has them. Primitives are created once per shape and cached.
//
//   if (matmul_16bit_available(DType::bf16))
//     gemm16({.transb = true, .m = rows, .n = out, .k = in, .lda = in, .ldb = in, .ldc = out,
//             .operands = DType::bf16, .result = DType::bf16}, x, w, bias, y);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace engine::ops {

struct Gemm16 {
  bool transa = false, transb = false;  // op(A) = A^T, op(B) = B^T
  int64_t m = 0, n = 0, k = 0;          // C (m, n) = op(A) (m, k) x op(B) (k, n)
  int64_t lda = 0, ldb = 0, ldc = 0;    // row strides of A, B and C as stored
  DType operands = DType::bf16;         // A, B and the bias
  DType result = DType::f32;            // C
  bool accumulate = false;              // C += instead of C =
  float scale = 1.0f;                   // C (+)= scale op(A) op(B)
};

// Whether oneDNN has a matmul for operands of `type` on this CPU (probed once).
bool matmul_16bit_available(DType type);

// oneDNN's name for the kernel it chooses for a 1024^3 product ("brg:avx512_core_amx_bf16", ...): the
// kernel the linears and the peak probe run. "" when there is
// no usable 16-bit matmul for `type` and linears compute in fp32 on widened copies.
std::string matmul_16bit_kernel(DType type);

// oneDNN's name for the kernel it runs for `shape` (with a bias or without).
std::string gemm16_kernel(const Gemm16& shape, bool with_bias);

// C = scale op(A) op(B) (+ bias broadcast over rows) (+ C when accumulating). Each thread keeps its
// own bound copy of a shape's primitive and its own oneDNN scratchpad, so threads may run one
// shape at once and a call costs a few microseconds of overhead: small products inside parallel
// loops (attention's tiles) pay little for it.
void gemm16(const Gemm16& shape, const void* a, const void* b, const void* bias, void* c);

// The scratchpad oneDNN's kernel for `shape` (without a bias) asks of each call: 0 where it needs
// none (tests skip what a machine's kernels cannot show).
size_t gemm16_scratchpad_bytes(const Gemm16& shape);

}  // namespace engine::ops
