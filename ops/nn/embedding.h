// embedding: rows of a table picked by token ids, plus (optionally) a learned position table.
//
//   tokens (B, T) i32   table (V, C)   positions (P, C) or none, P >= T   ->   out (B, T, C)
//   out[b, t] = table[tokens[b, t]] + positions[t]
//
// With position ids (B, T) i32 (packed documents: each token's position within its document), the
// position row is positions[ids[b, t]] instead of positions[t].
//
// Backward (embedding_backward): dtable[tokens[b, t]] += dout[b, t], dpositions[t] += dout[b, t].
// Rows hit by several tokens are summed in a fixed order: each thread owns a slice of channels.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId embedding(Graph& g, ValueId tokens, ValueId table, ValueId positions, const std::string& name,
                  ValueId position_ids = kNoValue);

// The vocabulary-parallel form (tensor parallelism, ops/parallel/tensor_parallel.h): `table` holds
// rows [vocab_begin, vocab_begin + V_local) of the vocabulary; a token outside them gives a zero row
// (and no gradient), and the position rows are added only where `add_positions` (one rank of the
// group, so that the group's sum holds them once; every rank computes their gradient).
ValueId vocab_embedding(Graph& g, ValueId tokens, ValueId table, ValueId positions, const std::string& name,
                        ValueId position_ids, int64_t vocab_begin, bool add_positions);

extern const OpDef kEmbedding, kEmbeddingBackward;

}  // namespace engine::ops
