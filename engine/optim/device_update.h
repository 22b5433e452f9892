// The optimizer step on the GPU (optim/update_kernels.cu): the CPU's update kernels, gradient
// scaling, norm partials and micro-batch sum over device arrays, with the CPU's bits (the element
// math is optim/update_math.h, shared with the CPU). Each call enqueues its kernel on `stream` (a
// cudaStream_t; null: the default stream) and returns; none allocates or synchronises. Pointers are
// device memory; any alignment works, 16-byte aligned arrays (or arrays that share one offset from
// a 16-byte boundary) take vector loads.
//
//   cuda::adamw_update(master + s.begin, opt_grad + s.begin, m + s.begin, v + s.begin,
//                      s.end - s.begin, s.decay ? with_decay : without_decay, stream);   // per Segment
//   cuda::norm_partials(opt_grad_shard, shard / kShardBlock, partials, stream);
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "optim/update_kernels.h"

namespace engine::cuda {

// One AdamW / SGD step over n parameters, in place (update_kernels.h); `momentum_buffer` is null
// without momentum. Bit for bit the CPU's adamw_update / sgd_update.
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s, void* stream);
void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s, void* stream);
// The same with the scalars in device memory, read when the kernel runs (a CUDA graph's update).
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars* s, void* stream);
void sgd_update(float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars* s, void* stream);

// x[i] *= factor (scale_gradients: factor = float(the double factor)); or *factor in device memory.
void scale(float* x, int64_t n, float factor, void* stream);
void scale(float* x, int64_t n, const float* factor, void* stream);

// partials[b] = block_squares(x + b * kShardBlock) for b < blocks (x: `blocks` whole blocks,
// contiguous): the CPU's 16 lanes and fixed tree, one half-warp per block.
void norm_partials(const float* x, int64_t blocks, double* partials, void* stream);

// sum[i] = sum[i] + micro[i], both of `type` (f32, bf16 or f16), added in fp32 and rounded to `type`
// to nearest even: the CPU's micro-batch accumulation (add_into).
void accumulate_gradients(void* sum, const void* micro, DType type, int64_t n, void* stream);

}  // namespace engine::cuda
