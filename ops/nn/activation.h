// Pointwise activations and their gradients. The math of each lives once, in a functor shared by
// forward and backward kernels (and by the CUDA kernels when they arrive).
//
//   gelu  (tanh approximation, as GPT-2):  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu:                                  max(x, 0)
//   silu:                                  x sigmoid(x)
//   swiglu(a, b) = silu(a) * b             (Llama's feed-forward gate; a and b have one shape)
#pragma once

#include <cmath>

#include "nn/fast_math.h"
#include "op_util.h"

namespace engine::ops {

struct Gelu {
  static constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float kKappa = 0.044715f;
  // 0.5 x (1 + tanh u) with u = kBeta (x + kKappa x^3), as x sigmoid(2u): the same function with
  // one exp and one division, and no cancellation in 1 + tanh u for negative x.
  static float forward(float x) { return x / (1.0f + fast_exp(-2.0f * kBeta * (x + kKappa * x * x * x))); }
  // d/dx = s + x s (1 - s) 2u', s = sigmoid(2u), since 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s).
  static float derivative(float x) {
    const float s = 1.0f / (1.0f + fast_exp(-2.0f * kBeta * (x + kKappa * x * x * x)));
    return s + x * s * (1.0f - s) * (2.0f * kBeta) * (1.0f + 3.0f * kKappa * x * x);
  }
};

struct Relu {
  static float forward(float x) { return x > 0.0f ? x : 0.0f; }
  static float derivative(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct Silu {
  static float forward(float x) { return x / (1.0f + fast_exp(-x)); }
  static float derivative(float x) {
    float s = 1.0f / (1.0f + fast_exp(-x));
    return s * (1.0f + x * (1.0f - s));
  }
};

ValueId gelu(Graph& g, ValueId x, const std::string& name);
ValueId relu(Graph& g, ValueId x, const std::string& name);
ValueId silu(Graph& g, ValueId x, const std::string& name);
ValueId swiglu(Graph& g, ValueId a, ValueId b, const std::string& name);

extern const OpDef kGelu, kGeluBackward, kRelu, kReluBackward, kSilu, kSiluBackward, kSwiglu, kSwigluBackward;

}  // namespace engine::ops
