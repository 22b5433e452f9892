// Dropout's mask and scale as one definition for the CPU kernel (nn/dropout.cpp) and the CUDA kernel
// (nn/dropout.cu), so both draw the same Philox words and keep the same elements, bit for bit.
//
// Element i belongs to block i / 4, whose 4 words are Philox4x32-10 at counter (block, salt, step,
// micro-step) under a key from the run seed; word i % 4 keeps the element when it is at least
// p 2^32, and a kept element is scaled by 1 / (1 - p) (rounded to float once).
//
//   const DropoutMask mask = DropoutMask::make(p, salt, ctx.seed, ctx.step, ctx.micro_step);
//   PhiloxWords w = mask.block(i / 4);
//   float y = mask.apply(w.word[i % 4], x);
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/philox.h"

namespace engine::ops {

struct DropoutMask {
  PhiloxKey key;
  uint32_t salt, step, micro_step;
  uint32_t threshold;  // p 2^32: a word below it drops its element
  float scale;         // 1 / (1 - p)

  static DropoutMask make(double p, int64_t salt, uint64_t seed, uint64_t step, uint64_t micro_step) {
    DropoutMask mask{{}, uint32_t(salt), 0, 0, uint32_t(p * 4294967296.0), float(1.0 / (1.0 - p))};
    mask.set_stream(seed, step, micro_step);
    return mask;
  }
  // The stream's position: which step and micro-batch (a CUDA kernel sets it from device memory).
  ENGINE_HOST_DEVICE void set_stream(uint64_t seed, uint64_t step_index, uint64_t micro_step_index) {
    key = PhiloxKey{{uint32_t(seed), uint32_t(seed >> 32) ^ 0x64726f70u}};
    step = uint32_t(step_index);
    micro_step = uint32_t(micro_step_index);
  }
  // The 4 words of elements 4 block .. 4 block + 3.
  ENGINE_HOST_DEVICE PhiloxWords block(int64_t block) const {
    return philox4x32_10({{uint32_t(block), salt, step, micro_step}}, key);
  }
  // The element's output (before any accumulation, which adds it after rounding).
  ENGINE_HOST_DEVICE float apply(uint32_t word, float x) const { return word >= threshold ? x * scale : 0.0f; }
};

}  // namespace engine::ops
