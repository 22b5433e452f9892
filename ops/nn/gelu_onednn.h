// GELU (tanh approximation) through oneDNN's eltwise primitive, forward and backward.
//
// oneDNN generates the code at run time for the widest vectors of the CPU it runs on (AVX-512 and
// its bf16 conversions where present), which the engine's own kernels, built for x86-64-v3, cannot
// use. GELU is bound by its exp, not by memory, on a few cores: on a 2-core AVX512-BF16 EPYC the
// primitive computes 3.1M bf16 elements in 1.7 ms on one thread against 4.0 ms for the engine's
// AVX2 loop. At AVX2 it is the other way round: on a 2-core AVX2 EPYC (Zen 3) oneDNN's AVX2 kernel
// takes 7.6 ms forward and 6.9 ms backward for 3.1M fp32 elements on 2 threads, the engine's loop
// 1.6 and 2.4 ms (bench/kernel_isa_bench; likely oneDNN's AVX2 tanh, which reads its coefficients
// with vector gathers, slow on AMD cores), and oneDNN has no bf16 GELU kernel below AVX-512. So
// GELU goes through oneDNN only where the kernels run at AVX-512 (core/cpu_isa.h;
// ONEDNN_MAX_CPU_ISA=AVX2 caps both). Both return false where the primitive is not wanted or oneDNN
// has only its reference C++ kernel for the type (an older CPU, f16 without AVX512-FP16): the
// caller then runs its own loop.
//
//   if (!onednn_gelu_forward(DType::bf16, n, x, y)) { /* the engine's loop */ }
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace engine::ops {

// Which GELU runs: oneDNN's where the kernels run at AVX-512 (automatic), or one of the two
// everywhere (benchmarks and tests compare them). Not thread-safe; set it between steps.
enum class GeluPath { automatic, onednn, engine };
void set_gelu_path(GeluPath path);

// Whether oneDNN has JIT kernels for both directions of GELU over n elements of `type` on this CPU
// (where it has not, GeluPath::onednn runs the engine's loop too).
bool onednn_gelu_available(DType type, int64_t n);

// y = gelu(x); x and y of `type`, n elements each.
bool onednn_gelu_forward(DType type, int64_t n, const void* x, void* y);
// dx = gelu'(x) dy; all three of `type`.
bool onednn_gelu_backward(DType type, int64_t n, const void* x, const void* dy, void* dx);

}  // namespace engine::ops
