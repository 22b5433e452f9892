// CUDA kernels of embedding and its backward (CPU: embedding_cpu, embedding_backward_cpu in
// nn/embedding.cpp), on f32 tables (the executor widens 16-bit ones) and i32 token ids.
//
// Forward: one thread per output element, out = table[token] (+ positions[t]).
// Backward, both gradients added to in the CPU's order, so with the CPU's bits and no atomics:
// - positions: one thread per (t, channel) adds dout[b, t] for b = 0, 1, ... in order;
// - table: the token ids are sorted (CUB's radix sort is stable: equal ids keep their order) with
//   their positions, in the workspace; then one block per run of equal ids, each thread a channel,
//   adds the run's dout rows in position order to its table row.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

__global__ void embedding_kernel(const int32_t* tokens,   // (B T)
                                 const float* table,      // (V, C)
                                 const float* positions,  // (P, C) or null
                                 float* out,              // (B T, C)
                                 int64_t rows, int64_t time, int64_t channels) {
  for (int64_t i = thread_index(); i < rows * channels; i += thread_stride()) {
    const int64_t bt = i / channels, c = i % channels;
    const float v = table[int64_t(tokens[bt]) * channels + c];
    out[i] = positions ? v + positions[(bt % time) * channels + c] : v;
  }
}

__global__ void position_gradient_kernel(const float* dout,  // (B, T, C)
                                         float* dpositions,  // (P, C), rows [0, T) added to
                                         int64_t batch, int64_t time, int64_t channels) {
  for (int64_t i = thread_index(); i < time * channels; i += thread_stride()) {
    float acc = dpositions[i];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * time * channels + i];
    dpositions[i] = acc;
  }
}

__global__ void iota_kernel(int32_t* values, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) values[i] = int32_t(i);
}

// Block i: if sorted id i starts a run of equal ids, adds the run's dout rows (in position order)
// to that id's table row; other blocks return at once.
__global__ void table_gradient_kernel(const uint32_t* sorted_ids,   // (N)
                                      const int32_t* sorted_rows,   // (N) positions of the ids in dout
                                      const float* dout,            // (N, C)
                                      float* dtable,                // (V, C) added to
                                      int64_t n, int64_t channels) {
  const int64_t first = blockIdx.x;
  const uint32_t id = sorted_ids[first];
  if (first > 0 && sorted_ids[first - 1] == id) return;
  int64_t end = first + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  float* row = dtable + int64_t(id) * channels;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    float acc = row[c];
    for (int64_t j = first; j < end; ++j) acc += dout[int64_t(sorted_rows[j]) * channels + c];
    row[c] = acc;
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// inputs tokens (B, T) i32, table (V, C) [, positions (P, C)]; output (B, T, C)
void embedding(const Node& node, const KernelContext& ctx) {
  const Shape& ts = ctx.shape(node.inputs[0]);
  const int64_t rows = ts[0] * ts[1], time = ts[1], channels = ctx.shape(node.inputs[1])[1];
  if (rows == 0 || channels == 0) return;
  const float* positions = node.inputs.size() > 2 ? ctx.f32(node.inputs[2]) : nullptr;
  embedding_kernel<<<blocks_for(rows * channels), kThreads, 0, stream(ctx)>>>(
      ctx.i32(node.inputs[0]), ctx.f32(node.inputs[1]), positions, ctx.f32(node.outputs[0]), rows, time, channels);
  check_launch("embedding_kernel");
}

// inputs dout (B, T, C), tokens (B, T) i32; outputs dtable (V, C) [, dpositions (P, C)], added to
void embedding_backward(const Node& node, const KernelContext& ctx) {
  const Shape& ds = ctx.shape(node.inputs[0]);
  const int64_t batch = ds[0], time = ds[1], channels = ds[2], n = batch * time;
  const int64_t vocab = ctx.shape(node.outputs[0])[0];
  if (n == 0 || channels == 0) return;
  const float* dout = ctx.f32(node.inputs[0]);
  if (node.outputs.size() > 1) {
    position_gradient_kernel<<<blocks_for(time * channels), kThreads, 0, stream(ctx)>>>(
        dout, ctx.f32(node.outputs[1]), batch, time, channels);
    check_launch("position_gradient_kernel");
  }
  if (n > INT32_MAX) throw InternalError("embedding_backward: more than 2^31 tokens");
  int end_bit = 1;
  while (end_bit < 32 && (uint64_t(1) << end_bit) < uint64_t(vocab)) ++end_bit;
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
                        " bytes) is smaller than the sort needs (" + std::to_string(3 * array_bytes + sort_bytes) + ")");
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
  table_gradient_kernel<<<unsigned(n), threads, 0, stream(ctx)>>>(sorted_ids, sorted_rows, dout,
                                                                   ctx.f32(node.outputs[0]), n, channels);
  check_launch("table_gradient_kernel");
}

}  // namespace engine::cuda
