// CUDA kernel of dropout and dropout_backward (nn/dropout.cpp apply_mask): out (+)= in * keep / (1 - p)
// on f32, bf16 or f16 values read and written in their own types (fp32 arithmetic, one rounding of
// each output: the bits of the executor's widening and rounding), drawing the CPU's Philox words (nn/dropout_math.h),
// so the masks are the same bits.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/dropout_math.h"

namespace engine::cuda {

namespace {

// Four elements of T in one aligned access (the elements of one Philox call).
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

// One thread per block of 4 elements (one Philox call), grid-stride. T: the type of both arrays
// (void: mixed, each read by its own type); `packed`: both aligned to 4 elements, whole blocks read
// and written in one access each.
template <class T>
__global__ void dropout_kernel(FloatArray<T> in, FloatArray<T> out, int64_t n, ops::DropoutMask mask,
                               const StepScalars* step, bool accumulate, bool packed) {
  mask.set_stream(step->seed, step->step, step->micro_step);
  const int64_t blocks = (n + 3) / 4;
  for (int64_t block = thread_index(); block < blocks; block += thread_stride()) {
    const PhiloxWords words = mask.block(block);
    if constexpr (!std::is_void_v<T>) {
      if (packed && block * 4 + 4 <= n) {
        const Quad<T> x = reinterpret_cast<const Quad<T>*>(in.p)[block];
        Quad<T>& y = reinterpret_cast<Quad<T>*>(out.p)[block];
        Quad<T> r;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float v = mask.apply(words.word[j], to_float(x.v[j]));
          r.v[j] = from_float<T>(accumulate ? to_float(y.v[j]) + v : v);
        }
        y = r;
        continue;
      }
    }
    for (int64_t j = 0; j < 4 && block * 4 + j < n; ++j) {
      const int64_t i = block * 4 + j;
      const float v = mask.apply(words.word[j], in.load(i));
      out.store(i, accumulate ? out.load(i) + v : v);
    }
  }
}

}  // namespace

// inputs[0]: x (forward) or dy (backward); attrs: salt (ints[0]), p (floats[0])
void dropout_mask(const Node& node, const KernelContext& ctx) {
  if (!ctx.training) return copy(node, ctx);  // evaluation: the identity, as on the CPU
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  // The stream's position comes from the step's scalars in device memory.
  const ops::DropoutMask mask = ops::DropoutMask::make(node.attrs.floats[0], node.attrs.ints[0], 0, 0, 0);
  if (!ctx.step_scalars) throw InternalError("dropout on CUDA: the context has no step scalars");
  const ValueId in = node.inputs[0], out = node.outputs[0];
  with_float_type(ctx, {in, out}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto quad_aligned = [&](ValueId id) {
      return reinterpret_cast<uintptr_t>(ctx.data(id)) % (4 * dtype_size(ctx.dtype(id))) == 0;
    };
    const bool packed = !std::is_void_v<T> && quad_aligned(in) && quad_aligned(out);
    dropout_kernel<T><<<blocks_for((n + 3) / 4), kThreads, 0, stream(ctx)>>>(
        float_array<T>(ctx, in), float_array<T>(ctx, out), n, mask, ctx.step_scalars, ctx.accumulates(node, 0), packed);
  });
  check_launch("dropout");
}

}  // namespace engine::cuda
