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
//   for (const UpdateChunk& c : table)          // a CUDA block each
//     for (int t = 0; t < 256; ++t) update_chunk<true>(c, t, 256, scalars, memory);   // its threads
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

// ---- The update's block program ---------------------------------------------------------------------
//
// What thread `thread` of a block of `threads` does for chunk c (update_kernels.cu runs it as one
// CUDA block per chunk; tests/optim/update_chunks_test.cpp runs every thread of it on the CPU): the
// packs thread, thread + threads, ... of 4 elements each, then the elements before and after the
// packs one at a time; nothing where the decision skips the update. `M`, the memory policy, moves
// 4 elements at a time at a pack: the kernel's with 16-byte loads of w, m and v, the 4 gradients in
// one access of their type and, where c.copy_packs says so, the 4 copies in one store; the CPU
// test's element by element.
template <bool kAdamW, class M>
ENGINE_HOST_DEVICE void update_chunk(const UpdateChunk& c, int64_t thread, int64_t threads, const MultiTensorScalars& s,
                                     const M& memory) {
  if (s.decision.skip) return;
  const auto factor = float(s.decision.factor);
  for (int64_t p = thread; p < c.packs; p += threads) {
    const int64_t at = c.head + p * 4;
    float w[4], g[4], m[4] = {}, v[4] = {};
    memory.load4(c.w + at, w);
    memory.gradients4(c.g, at, g);
    if (c.m) memory.load4(c.m + at, m);
    if (c.v) memory.load4(c.v + at, v);
    for (int j = 0; j < 4; ++j) update_element<kAdamW>(w[j], g[j], c.m ? &m[j] : nullptr, &v[j], factor, s, c.decay);
    memory.store4(c.w + at, w);
    if (c.m) memory.store4(c.m + at, m);
    if (c.v) memory.store4(c.v + at, v);
    if (c.copy) memory.copies4(c.copy, at, w, c.copy_packs != 0);
  }
  const auto one = [&](int64_t i) {
    update_element<kAdamW>(c.w[i], memory.gradient(c.g, i), c.m ? c.m + i : nullptr, c.v ? c.v + i : nullptr, factor, s,
                           c.decay);
    if (c.copy) memory.copy(c.copy, i, c.w[i]);
  };
  for (int64_t i = thread; i < c.head; i += threads) one(i);
  for (int64_t i = c.head + c.packs * 4 + thread; i < c.n; i += threads) one(i);
}

}  // namespace engine
