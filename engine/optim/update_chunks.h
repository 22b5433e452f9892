// UpdateChunk: a piece of a multi-tensor optimizer step on the GPU. A resident run's update is one
// kernel launch over a table of chunks (optim/device_update.h update_chunks): each CUDA block takes
// one chunk, at most kUpdateChunk elements of one weight-decay segment (optimizer.h decay_segments),
// and for each element scales its gradient by the step's factor (clipping and the loss scale's
// inverse), applies AdamW or SGD and writes the compute-type copy of the new weight. What used to be
// a scaling pass, a kernel per segment (GPT-2 has 150, most of them a bias of 768 elements) and a
// rounding pass per unit is one pass over the model state.
//
// The element is the CPU's: scale_gradients' float product, then update_math.h's AdamW or SGD, then
// the rounding of the 16-bit copy; tests/optim/update_chunks_test.cpp runs the table on the CPU
// against Optimizer::step. The gradients are read in their own type: a bf16 run's step sum is read
// where the backward (or the micro-batches' sum) left it, widened exactly in registers, as the CPU
// widens it into its fp32 gradients first.
//
//   std::vector<UpdateChunk> table = plan_update_chunks(segments, units, /*copy_size*/ 2);
//   for (const UpdateChunk& c : table) for (int64_t i = 0; i < c.n; ++i)
//     update_element<true>(c.w[i], static_cast<const float*>(c.g)[i], c.m + i, c.v + i, factor, scalars, c.decay);
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_device.h"
#include "optim/optimizer.h"
#include "optim/update_math.h"

namespace engine {

inline constexpr int64_t kUpdateChunk = int64_t(1) << 15;

struct UpdateChunk {
  float* w = nullptr;       // the fp32 weights (the masters)
  const void* g = nullptr;  // their gradients, unscaled, in the gradient type (f32, bf16 or f16)
  float* m = nullptr;       // AdamW's first moment, or SGD's momentum buffer (null without momentum)
  float* v = nullptr;       // AdamW's second moment
  void* copy = nullptr;     // where the weights' compute-type copy goes (null: the weights are the model's)
  int64_t n = 0;
  // Elements [0, head) one at a time, then `packs` packs of 4 with 16-byte loads, then the rest one
  // at a time. Packs need w, m and v at one offset from a 16-byte boundary and g's 4 elements at a
  // pack aligned to their size; else head = n.
  int64_t head = 0, packs = 0;
  int32_t decay = 0;       // 1: the scalars with weight decay
  int32_t copy_packs = 0;  // the copy's 4 elements at a pack are one aligned store
};

// A unit's arrays, each the unit's whole optimizer range.
struct UpdateArrays {
  float* w = nullptr;
  const void* g = nullptr;  // elements of `grad_size` bytes
  float* m = nullptr;
  float* v = nullptr;
  std::byte* copy = nullptr;  // elements of `copy_size` bytes
};

// Every segment cut into chunks of at most kUpdateChunk elements, in segment order; `copy_size` is
// the compute type's size (2 for bf16 and f16), `grad_size` the gradient type's.
std::vector<UpdateChunk> plan_update_chunks(const std::vector<Segment>& segments,
                                            const std::vector<UpdateArrays>& units, int64_t copy_size,
                                            int64_t grad_size = 4);

// The scalars one update reads from device memory, written by the host before it (the learning
// rate's, the policy) and by the device (the decision).
struct MultiTensorScalars {
  AdamWScalars adamw[2];  // [decay]
  SgdScalars sgd[2];
  StepPolicy policy;
  UpdateDecision decision;
};

// One element: the gradient (widened exactly from its type) scaled by `factor` (as scale_gradients
// scales the fp32 gradients), then the update.
template <bool kAdamW>
ENGINE_HOST_DEVICE inline void update_element(float& w, float g, float* m, float* v, float factor,
                                              const MultiTensorScalars& s, int32_t decay) {
  const float scaled = g * factor;
  if constexpr (kAdamW)
    adamw_element(w, scaled, *m, *v, s.adamw[decay]);
  else
    sgd_element(w, scaled, m, s.sgd[decay]);
}

}  // namespace engine
