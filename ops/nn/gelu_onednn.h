// GELU (tanh approximation) through oneDNN's eltwise primitive, forward and backward.
//
// oneDNN generates the code at run time for the widest vectors of the CPU it runs on (AVX-512 and
// its bf16 conversions where present), which the engine's own kernels, built for x86-64-v3, cannot
// use. GELU is bound by its exp, not by memory, on a few cores: on a 2-core AVX512-BF16 EPYC the
// primitive computes 3.1M bf16 elements in 1.7 ms on one thread against 4.0 ms for the engine's
// AVX2 loop. Both return false where oneDNN has only its reference C++ kernel for the type (an
// older CPU, f16 without AVX512-FP16): the caller then runs its own loop.
//
//   if (!onednn_gelu_forward(DType::bf16, n, x, y)) { /* the engine's loop */ }
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::ops {

// y = gelu(x); x and y of `type`, n elements each.
bool onednn_gelu_forward(DType type, int64_t n, const void* x, void* y);
// dx = gelu'(x) dy; all three of `type`.
bool onednn_gelu_backward(DType type, int64_t n, const void* x, const void* dy, void* dx);

}  // namespace engine::ops
