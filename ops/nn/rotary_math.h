// The rotary embedding's frequencies, written once for the CPU kernel (nn/rotary.cpp) and the CUDA
// kernel (nn/rotary.cu): theta^(-2i/hd) for pair i of a head hd wide, rescaled for a context longer
// than the one the model was trained at as Hugging Face's `rope_scaling` says:
//   linear (position interpolation): every frequency divided by `factor`;
//   llama3 (Llama 3.1 and 3.2): by wavelength 2 pi / f against the original context L:
//     wavelength < L / high_freq_factor   f                  (fast rotations, kept)
//     wavelength > L / low_freq_factor    f / factor         (slow rotations, stretched)
//     otherwise                           (1 - s) f / factor + s f,  s = (L / wavelength - low) / (high - low)
// In double on both devices, as transformers' _compute_llama3_parameters orders it.
//
//   const RopeFrequencies f{.theta = 500000, .scaling = RopeScaling::llama3, .factor = 32};
//   double angle = t * rope_inverse_frequency(f, i, head_size);
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace engine::ops {

enum class RopeScaling : int64_t { none = 0, linear = 1, llama3 = 2 };

struct RopeFrequencies {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0;               // linear, llama3
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double original_context = 8192.0;  // llama3: the context length the model was trained at
};

ENGINE_HOST_DEVICE inline double rope_inverse_frequency(const RopeFrequencies& f, int64_t i, int64_t head_size) {
  const double plain = pow(f.theta, -2.0 * double(i) / double(head_size));
  if (f.scaling == RopeScaling::linear) return plain / f.factor;
  if (f.scaling != RopeScaling::llama3) return plain;
  const double wavelength = 2.0 * 3.141592653589793 / plain;
  if (wavelength < f.original_context / f.high_freq_factor) return plain;
  if (wavelength > f.original_context / f.low_freq_factor) return plain / f.factor;
  const double smooth =
      (f.original_context / wavelength - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  return (1.0 - smooth) * plain / f.factor + smooth * plain;
}

}  // namespace engine::ops
