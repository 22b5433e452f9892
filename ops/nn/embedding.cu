// CUDA kernels of embedding and its backward (CPU: embedding_cpu, embedding_backward_cpu in
// nn/embedding.cpp), on f32, bf16 or f16 tables, outputs and gradients read and written in their own
// types (each output element rounded once, each gradient sum kept in fp32 and rounded once at its
// end: the bits of the executor's widening and rounding) and i32 token ids.
//
// Forward: one thread per output element, out = table[token] (+ positions[t]).
// Backward, both gradients added to in the CPU's order, so with the CPU's bits and no atomics:
// - positions: one thread per (t, channel) adds dout[b, t] for b = 0, 1, ... in order;
// - table: the token ids are sorted (CUB's radix sort is stable: equal ids keep their order) with
//   their positions, in the workspace; then one block per run of equal ids, each thread a channel,
//   adds the run's dout rows in position order to its table row.
// A token id outside [0, V) reads a zero row and adds to no row, as on the CPU (the data loader
// refuses such ids; this keeps other sources from reading or writing outside the table).
#include <cub/device/device_radix_sort.cuh>

#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

// T: the type of table, positions and out (void: mixed, each read by its own type).
template <class T>
__global__ void embedding_kernel(const int32_t* tokens,    // (B T)
                                 FloatArray<T> table,      // (V, C)
                                 FloatArray<T> positions,  // (P, C) or null
                                 FloatArray<T> out,        // (B T, C)
                                 int64_t rows, int64_t time, int64_t channels, int64_t vocab) {
  for (int64_t i = thread_index(); i < rows * channels; i += thread_stride()) {
    const int64_t bt = i / channels, c = i % channels;
    const int64_t token = tokens[bt];
    const float v = token >= 0 && token < vocab ? table.load(token * channels + c) : 0.0f;
    out.store(i, positions ? v + positions.load((bt % time) * channels + c) : v);
  }
}

// D: the type of dout; G: of the gradient (void: typed at run time).
template <class D, class G>
__global__ void position_gradient_kernel(FloatArray<D> dout,        // (B, T, C)
                                         FloatArray<G> dpositions,  // (P, C), rows [0, T) added to
                                         int64_t batch, int64_t time, int64_t channels) {
  for (int64_t i = thread_index(); i < time * channels; i += thread_stride()) {
    float acc = dpositions.load(i);
    for (int64_t b = 0; b < batch; ++b) acc += dout.load(b * time * channels + i);
    dpositions.store(i, acc);
  }
}

__global__ void iota_kernel(int32_t* values, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) values[i] = int32_t(i);
}

// Block i: if sorted id i starts a run of equal ids, adds the run's dout rows (in position order)
// to that id's table row; other blocks return at once.
template <class D, class G>
__global__ void table_gradient_kernel(const uint32_t* sorted_ids,  // (N)
                                      const int32_t* sorted_rows,  // (N) positions of the ids in dout
                                      FloatArray<D> dout,          // (N, C)
                                      FloatArray<G> dtable,        // (V, C) added to
                                      int64_t n, int64_t channels, int64_t vocab) {
  const int64_t first = blockIdx.x;
  const uint32_t id = sorted_ids[first];
  if (int64_t(id) >= vocab || (first > 0 && sorted_ids[first - 1] == id)) return;  // negative ids are >= vocab here
  int64_t end = first + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  const FloatArray<G> row = dtable + int64_t(id) * channels;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    float acc = row.load(c);
    for (int64_t j = first; j < end; ++j) acc += dout.load(int64_t(sorted_rows[j]) * channels + c);
    row.store(c, acc);
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// inputs tokens (B, T) i32, table (V, C) [, positions (P, C)]; output (B, T, C)
void embedding(const Node& node, const KernelContext& ctx) {
  const Shape& ts = ctx.shape(node.inputs[0]);
  const int64_t rows = ts[0] * ts[1], time = ts[1], channels = ctx.shape(node.inputs[1])[1];
  if (rows == 0 || channels == 0) return;
  const bool has_positions = node.inputs.size() > 2;
  // The table, the positions where there are any, the output (an initializer_list made in a
  // conditional would not outlive its full-expression).
  with_float_type(ctx, {node.inputs[1], node.inputs[has_positions ? 2 : 1], node.outputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_kernel<T><<<blocks_for(rows * channels), kThreads, 0, stream(ctx)>>>(
        ctx.i32(node.inputs[0]), float_array<T>(ctx, node.inputs[1]),
        has_positions ? float_array<T>(ctx, node.inputs[2]) : FloatArray<T>{}, float_array<T>(ctx, node.outputs[0]),
        rows, time, channels, ctx.shape(node.inputs[1])[0]);
  });
  check_launch("embedding_kernel");
}

// inputs dout (B, T, C), tokens (B, T) i32; outputs dtable (V, C) [, dpositions (P, C)], added to
void embedding_backward(const Node& node, const KernelContext& ctx) {
  const Shape& ds = ctx.shape(node.inputs[0]);
  const int64_t batch = ds[0], time = ds[1], channels = ds[2], n = batch * time;
  const int64_t vocab = ctx.shape(node.outputs[0])[0];
  if (n == 0 || channels == 0) return;
  // Launches kernel<D, G> for the types of dout and of the gradient `grad`.
  const auto with_types = [&](ValueId grad, auto&& launch) {
    with_float_type(ctx, {node.inputs[0]}, [&](auto dout_tag) {
      with_float_type(ctx, {grad}, [&](auto grad_tag) { launch(dout_tag, grad_tag); });
    });
  };
  if (node.outputs.size() > 1) {
    with_types(node.outputs[1], [&](auto dout_tag, auto grad_tag) {
      using D = typename decltype(dout_tag)::type;
      using G = typename decltype(grad_tag)::type;
      position_gradient_kernel<D, G><<<blocks_for(time * channels), kThreads, 0, stream(ctx)>>>(
          float_array<D>(ctx, node.inputs[0]), float_array<G>(ctx, node.outputs[1]), batch, time, channels);
    });
    check_launch("position_gradient_kernel");
  }
  if (n > INT32_MAX) throw InternalError("embedding_backward: more than 2^31 tokens");
  // Every bit of the ids: an id outside the table (which the gradient skips) must not sort among
  // the ids that share its low bits and split their runs.
  const int end_bit = 32;
  // Workspace: sorted ids, positions before and after the sort, then CUB's scratch.
  const auto* ids = reinterpret_cast<const uint32_t*>(ctx.i32(node.inputs[1]));
  size_t sort_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, static_cast<uint32_t*>(nullptr),
                                        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(n), 0,
                                        end_bit, stream(ctx)),
        "embedding_backward: sort size");
  const size_t array_bytes = aligned(size_t(n) * sizeof(int32_t));
  if (3 * array_bytes + sort_bytes > ctx.workspace_bytes || ctx.workspace == nullptr)
    throw InternalError("embedding_backward: the workspace (" + std::to_string(ctx.workspace_bytes) +
                        " bytes) is smaller than the sort needs (" + std::to_string(3 * array_bytes + sort_bytes) +
                        ")");
  auto* base = static_cast<char*>(ctx.workspace);
  auto* sorted_ids = reinterpret_cast<uint32_t*>(base);
  auto* rows_in = reinterpret_cast<int32_t*>(base + array_bytes);
  auto* sorted_rows = reinterpret_cast<int32_t*>(base + 2 * array_bytes);
  void* sort_scratch = base + 3 * array_bytes;
  iota_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(rows_in, n);
  check_launch("iota_kernel");
  check(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, ids, sorted_ids, rows_in, sorted_rows, int(n), 0,
                                        end_bit, stream(ctx)),
        "embedding_backward: sort");
  check_launch("embedding_backward: sort");
  const int threads = channels >= 256 ? 256 : int((channels + 31) / 32 * 32);
  with_types(node.outputs[0], [&](auto dout_tag, auto grad_tag) {
    using D = typename decltype(dout_tag)::type;
    using G = typename decltype(grad_tag)::type;
    table_gradient_kernel<D, G>
        <<<unsigned(n), threads, 0, stream(ctx)>>>(sorted_ids, sorted_rows, float_array<D>(ctx, node.inputs[0]),
                                                   float_array<G>(ctx, node.outputs[0]), n, channels, vocab);
  });
  check_launch("table_gradient_kernel");
}

}  // namespace engine::cuda
