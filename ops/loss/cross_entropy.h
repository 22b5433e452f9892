// softmax_cross_entropy: per-row loss of logits against integer targets, fused with its gradient.
//
//   logits (N, V)  targets (N) i32  ->  losses (N),  losses[n] = logsumexp(logits[n]) - logits[n, targets[n]]
//
// The forward kernel also overwrites the logits with their gradient, scale * (softmax - onehot),
// as llm.c does: the (N, V) buffer is the largest activation of a language model and is never
// needed again, so its gradient costs no memory. `scale` is 1 / (rows per optimizer step), which
// makes the accumulated gradient that of the mean loss. The logits must not be read after this op.
//
// A target of kIgnoredTarget (-1, PyTorch's ignore_index -100 in spirit) is not trained: its row's
// loss is 0 and its gradient row 0 (a prompt token of instruction data, data/files.h's loss mask).
#pragma once

#include <cstdint>

#include "op_util.h"

namespace engine::ops {

inline constexpr int32_t kIgnoredTarget = -1;

ValueId softmax_cross_entropy(Graph& g, ValueId logits, ValueId targets, double scale, const std::string& name);

extern const OpDef kSoftmaxCrossEntropy;

}  // namespace engine::ops
