// Tensor parallelism's ops (Megatron-LM's): the collectives at the edges of a split layer, and the
// cross-entropy of logits whose vocabulary is split across the group. Their kernels communicate
// through KernelContext::tensor_group (graph/op.h), blocking until the collective completes.
//
//   x (replicated) -> copy_to_tensor_group -> column-parallel linear (this rank's output columns)
//     -> ... -> row-parallel linear (this rank's input columns, a partial sum)
//     -> reduce_from_tensor_group (+ bias) -> y (replicated)
//
// copy_to_tensor_group  ("f"): forward the identity; backward all-reduces the input's gradient,
//                       whose parts the split layers after it computed.
// reduce_from_tensor_group ("g"): forward all-reduces the partial sums (and adds the bias, once);
//                       backward the identity (and the bias's gradient, the rows' sum).
// vocab_cross_entropy:  softmax_cross_entropy (loss/cross_entropy.h) over logits (N, V / T) holding
//                       the vocabulary rows [vocab_begin, vocab_begin + V / T): the row maxima are
//                       all-gathered, then each rank's sums of exponentials and the target's logit (from
//                       the rank holding it), so the whole logits are never gathered. Every rank gets
//                       the same losses; the logits are overwritten with their gradient, as there.
//
// Reductions are the communicator's: in rank order, rounded to the values' type, so every rank of the
// group holds the same bits. 16-bit values are reduced in their type (what is sent is 2 bytes each).
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId copy_to_tensor_group(Graph& g, ValueId x, const std::string& name);
// `bias` (the last dimension's width) or kNoValue.
ValueId reduce_from_tensor_group(Graph& g, ValueId x, ValueId bias, const std::string& name);
ValueId vocab_cross_entropy(Graph& g, ValueId logits, ValueId targets, double scale, int64_t vocab_begin,
                            const std::string& name);

extern const OpDef kCopyToTensorGroup, kReduceFromTensorGroup, kTensorGroupAllReduce, kBiasGradient, kVocabCrossEntropy;

// Bytes this rank sends for one all-reduce of `bytes` in a group of `size` (the communicator's
// reduce-scatter and all-gather: 2 (size - 1) / size of them): what `engine plan` counts.
inline int64_t all_reduce_bytes_sent(int64_t bytes, int size) { return 2 * (size - 1) * (bytes / size); }

}  // namespace engine::ops
