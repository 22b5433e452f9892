// Test inputs for the collectives: `count` values of `dtype` over many magnitudes and both signs,
// different for each `tag`, so that a sum in another order, or rounded other than once per step,
// gives other bits. Used by the NCCL and the staged communicators' tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace engine::testing {

inline std::vector<std::byte> collective_values(DType dtype, int tag, int64_t count) {
  std::vector<std::byte> out(size_t(count) * dtype_size(dtype));
  for (int64_t k = 0; k < count; ++k) {
    const float v = std::ldexp(1.0f + float((k * 37 + tag * 11) % 97) / 97.0f, int((k + tag) % 24) - 12) *
                    ((k + tag) % 3 ? 1.0f : -1.0f);
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * k, &v, 4);
    } else {
      const uint16_t bits = dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(out.data() + 2 * k, &bits, 2);
    }
  }
  return out;
}

}  // namespace engine::testing
