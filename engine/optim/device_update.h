// The optimizer step on the GPU (optim/update_kernels.cu): the CPU's update, gradient scaling,
// norm partials, clipping's decision and micro-batch sum over device arrays, with the CPU's bits (the element
// math is optim/update_math.h, shared with the CPU). Each call enqueues its kernel on `stream` (a
// cudaStream_t; null: the default stream) and returns; none allocates or synchronises. Pointers are
// device memory; any alignment works, 16-byte aligned arrays (or arrays that share one offset from
// a 16-byte boundary) take vector loads.
//
//   cuda::norm_partials(grad_sum, DType::bf16, n / kShardBlock, partials, stream);
//   cuda::decide_update(partials, n / kShardBlock, chunk_sums, scalars, stream);
//   cuda::update_chunks(table, chunks, /*adamw*/ true, scalars, DType::bf16, DType::bf16, stream);
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "optim/update_chunks.h"
#include "optim/update_kernels.h"

namespace engine::cuda {

// partials[b] = block_squares(x + b * kShardBlock) for b < blocks (x: `blocks` whole blocks of
// `type`, contiguous, 16-bit values widened exactly): the CPU's 16 lanes and fixed tree, one
// half-warp per block.
void norm_partials(const void* x, DType type, int64_t blocks, double* partials, void* stream);

// sum[i] = sum[i] + micro[i], both of `type` (f32, bf16 or f16), added in fp32 and rounded to `type`
// to nearest even: the CPU's micro-batch accumulation (add_into).
void accumulate_gradients(void* sum, const void* micro, DType type, int64_t n, void* stream);

// The step's decision from its norm's partial sums (update_math.h), with no host in between: the
// chunks of kNormChunk partials summed in parallel into `chunk_sums` (norm_chunks(count) doubles),
// then on one thread their sum, its square root and decide_update under scalars->policy, into
// scalars->decision. The bits of sum_norm_partials and Session's decision on the host.
void decide_update(const double* partials, int64_t count, double* chunk_sums, MultiTensorScalars* scalars,
                   void* stream);

// The multi-tensor update (update_chunks.h): one CUDA block per chunk of the device table `chunks`,
// AdamW (`adamw`) or SGD with scalars->adamw / sgd, each gradient (of `grad_type`, widened) times
// float(decision.factor), the weights' compute-type copies written in `copy_type` (f32: none);
// nothing at all where scalars->decision.skip is set.
void update_chunks(const UpdateChunk* chunks, int64_t count, bool adamw, const MultiTensorScalars* scalars,
                   DType copy_type, DType grad_type, void* stream);

}  // namespace engine::cuda
