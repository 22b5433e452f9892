// The offloaded optimizer: AdamW or SGD whose state (and the fp32 masters, where they are separate
// from the parameters) lives in an OffloadedState, updated where it lives by streaming it through
// memory chunk by chunk: the chunk's update runs the same kernels as the in-memory optimizer
// (optim/update_kernels.h) while the next chunk is read and the previous one written back, and
// writes the chunk's parameter copies (16-bit values, stage 3's shard) on the way, so training is
// bit-identical to no offload.
//
//   OffloadedState state(spec, ranges, offloaded_kinds(config, masters), dtype, shard);
//   ParameterStore store(graph, sharding, spec, &state);
//   auto optimizer = make_offloaded_optimizer(config, store, state);
//   optimizer->step(lr);      // state streamed; copies written; no refresh_copies() needed
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "offload/offloaded_state.h"
#include "optim/optimizer.h"

namespace engine {

// The fp32 kinds an offloaded optimizer keeps per element: "master" first when the masters move,
// then the optimizer's state tensors.
std::vector<std::string> offloaded_kinds(const recipe::OptimizerSection& config, bool masters);

std::unique_ptr<Optimizer> make_offloaded_optimizer(const recipe::OptimizerSection& config, ParameterStore& store,
                                                    OffloadedState& state);

}  // namespace engine
