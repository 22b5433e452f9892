// The ZeRO plan: where a step's collectives go and which arena buffers they use.
//
// A pass over a planned node list, beside recompute: it adds StepActions between nodes and the
// buffers they need as arena values with live ranges, so `engine plan` sizes them with the
// activations and the executor replays them with the kernels.
//
// Gradients (training, when there is anything to reduce): a unit's gradient is reduce-scattered as
// soon as the last node that writes it has run; the oldest reductions are waited for once more than
// `bucket_size` elements are in flight (one always stays in flight to overlap the backward pass).
// At stages 2-3 each unit's gradient lives in an arena buffer from its first write to that wait, so
// a rank never holds the whole gradient.
// Parameters (stage 3): every run of nodes that reads a unit's parameters without another unit's
// read in between is a cluster; the unit is gathered into its own arena buffer for each cluster,
// `prefetch` clusters ahead, and the buffer is released after the cluster's last read. Tied weights
// (the GPT head reads the embedding's matrix) are simply reads of another unit: gathered again.
//
//   Plan train = plan_zero_step(graph, layout, all_nodes(graph), {losses}, spec, /*training=*/true);
#pragma once

#include <cstdint>
#include <vector>

#include "dist/shard_layout.h"
#include "plan/plan.h"

namespace engine {

struct ZeroPlanSpec {
  int stage = 0;
  bool reduce = false;  // gradients are summed (more than one rank or micro-batch)
  int64_t bucket_size = int64_t(1) << 24;
  int64_t prefetch = 1;
};

// Where each wrap unit's gradients are written in `nodes` (positions into it): the first and the
// last node that writes them, -1 for both where no node does. After the last, the unit's gradients
// of the micro-batch are complete: the plan reduces them there, and a staged run downloads them.
struct GradientWrites {
  int first = -1, last = -1;
};
std::vector<GradientWrites> gradient_writes(const Graph& graph, const std::vector<size_t>& nodes);

Plan plan_zero_step(Graph& graph, const ShardLayout& layout, std::vector<size_t> nodes,
                    const std::vector<ValueId>& keep, const ZeroPlanSpec& spec, bool training);

}  // namespace engine
