#include "nn/embedding.h"

#include <algorithm>
#include <vector>

#include "cuda_kernels.h"
#include "elementwise/widened.h"

namespace engine::ops {

namespace {

// Which tokens this rank's table holds: all of them, or (vocab_embedding) rows
// [begin, begin + rows) of the vocabulary; and whether it adds the position rows.
struct VocabSlice {
  int64_t begin = 0, rows = 0;
  bool positions_here = true;
  int64_t local(int32_t token) const {
    const int64_t row = int64_t(token) - begin;
    return row >= 0 && row < rows ? row : -1;
  }
};
VocabSlice vocab_slice(const Node& node, int64_t rows) {
  if (node.attrs.ints.empty()) return {0, rows, true};
  return {node.attrs.ints[0], rows, node.attrs.ints[1] != 0};
}

// The CUDA kernels take the whole table only.
template <Kernel kernel, size_t inputs>
void cuda_whole_table(const Node& node, const KernelContext& ctx) {
  if (!node.attrs.ints.empty()) throw UserError(node.name + ": a vocabulary-parallel embedding is not on the GPU yet");
  cuda_without_position_ids<kernel, inputs>(node, ctx);
}

// Table rows by token (plus position rows), through the widened-rows route for 16-bit tables:
// only the rows a batch reads are widened, never the whole table.
void embedding_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& ts = ctx.shape(node.inputs[0]);
  int64_t batch = ts[0], time = ts[1], channels = ctx.shape(node.inputs[1])[1];
  const int32_t* tokens = ctx.i32(node.inputs[0]);
  const bool has_positions = node.inputs.size() > 2;
  const int32_t* ids = node.inputs.size() > 3 ? ctx.i32(node.inputs[3]) : nullptr;
  const InputRows table = input_rows(ctx, node.inputs[1], channels);
  const InputRows positions = input_rows(ctx, node.inputs[has_positions ? 2 : 1], channels);
  const OutputRows out = output_rows(ctx, node.outputs[0], channels, false);
  const VocabSlice slice = vocab_slice(node, ctx.shape(node.inputs[1])[0]);
  const bool add_positions = has_positions && slice.positions_here;
#pragma omp parallel
  {
    std::vector<float> table_buffer = table.buffer(), position_buffer = positions.buffer(), out_buffer = out.buffer();
    const std::vector<float> zeros(size_t(channels), 0.0f);
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < batch * time; ++bt) {
      const int64_t local = slice.local(tokens[bt]);
      const float* row = local >= 0 ? table.row(local, table_buffer.data()) : zeros.data();
      float* o = out.row(bt, out_buffer.data());
      if (add_positions) {
        const float* pos = positions.row(ids ? ids[bt] : bt % time, position_buffer.data());
        for (int64_t c = 0; c < channels; ++c) o[c] = row[c] + pos[c];
      } else {
        std::copy(row, row + channels, o);
      }
      out.store(bt, o);
    }
  }
}

// inputs: dout (B, T, C), tokens (B, T) [, position ids (B, T)]; outputs: dtable [, dpositions]
void embedding_backward_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& ds = ctx.shape(node.inputs[0]);
  int64_t batch = ds[0], time = ds[1], channels = ds[2];
  const float* dout = ctx.f32(node.inputs[0]);
  const int32_t* tokens = ctx.i32(node.inputs[1]);
  const int32_t* ids = node.inputs.size() > 2 ? ctx.i32(node.inputs[2]) : nullptr;
  float* dtable = ctx.f32(node.outputs[0]);
  float* dpos = node.outputs.size() > 1 ? ctx.f32(node.outputs[1]) : nullptr;
  const VocabSlice slice = vocab_slice(node, ctx.shape(node.outputs[0])[0]);
  const int64_t block = 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < channels; c0 += block) {
    int64_t c1 = std::min(channels, c0 + block);
    for (int64_t bt = 0; bt < batch * time; ++bt) {
      const float* d = dout + bt * channels;
      const int64_t local = slice.local(tokens[bt]);
      if (local >= 0) {
        float* row = dtable + local * channels;
        for (int64_t c = c0; c < c1; ++c) row[c] += d[c];
      }
      if (dpos) {
        float* p = dpos + (ids ? ids[bt] : bt % time) * channels;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

void embedding_grad(GradBuilder& gb, const Node& node) {
  ValueId dout = gb.grad(node.outputs[0]);
  if (dout == kNoValue) return;
  std::vector<ValueId> outs{gb.target(node.inputs[1]).value};
  if (node.inputs.size() > 2) outs.push_back(gb.target(node.inputs[2]).value);
  std::vector<ValueId> ins{dout, node.inputs[0]};
  if (node.inputs.size() > 3) ins.push_back(node.inputs[3]);
  gb.graph().add_node(Node{&kEmbeddingBackward, ins, outs, node.attrs, true, true, node.name});
}

}  // namespace

const OpDef kEmbedding{.name = "embedding",
                       .cpu = embedding_cpu,
                       .cuda = cuda_whole_table<cuda::embedding, 3>,
                       .grad = embedding_grad,
                       .flops = elementwise_flops,
                       .native_16bit = kWidenedRows,
                       .cuda_16bit = "16-bit table rows read and output written directly, adds in fp32"};
const OpDef kEmbeddingBackward{
    .name = "embedding_backward",
    .cpu = embedding_backward_cpu,
    .cuda = cuda_whole_table<cuda::embedding_backward, 2>,
    .flops = [](const Graph& g, const Node& n) { return double(g.value(n.inputs[0]).shape.numel()); },
    .cuda_16bit = "16-bit gradients read directly, sums in fp32 rounded once into the gradients' types"};

ValueId embedding(Graph& g, ValueId tokens, ValueId table, ValueId positions, const std::string& name,
                  ValueId position_ids) {
  return vocab_embedding(g, tokens, table, positions, name, position_ids, -1, true);
}

ValueId vocab_embedding(Graph& g, ValueId tokens, ValueId table, ValueId positions, const std::string& name,
                        ValueId position_ids, int64_t vocab_begin, bool add_positions) {
  const Shape& ts = g.value(tokens).shape;
  const Shape& tab = g.value(table).shape;
  if (ts.rank() != 2 || g.value(tokens).dtype != DType::i32) shape_error(name, "tokens must be (B, T) int32");
  if (tab.rank() != 2) shape_error(name, "table must be (V, C), got " + tab.str());
  std::vector<ValueId> inputs{tokens, table};
  if (positions != kNoValue) {
    const Shape& ps = g.value(positions).shape;
    if (ps.rank() != 2 || ps[1] != tab[1] || ps[0] < ts[1])
      shape_error(name, "position table " + ps.str() + " cannot cover " + std::to_string(ts[1]) +
                            " positions of width " + std::to_string(tab[1]));
    inputs.push_back(positions);
    if (position_ids != kNoValue) {
      if (g.value(position_ids).shape != ts || g.value(position_ids).dtype != DType::i32)
        shape_error(name, "position ids must be (B, T) int32 like the tokens");
      inputs.push_back(position_ids);
    }
  }
  ValueId out = g.add_activation(name + ".out", Shape{ts[0], ts[1], tab[1]});
  Attrs attrs;
  if (vocab_begin >= 0) attrs.ints = {vocab_begin, add_positions ? 1 : 0};
  g.add_node(Node{&kEmbedding, inputs, {out}, attrs, false, false, name});
  return out;
}

}  // namespace engine::ops
