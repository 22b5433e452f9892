// The scalar math of the pointwise activations, written once for the CPU kernels (nn/activation.cpp)
// and the CUDA kernels (nn/activation.cu): the same operations in the same order on both devices.
//
//   float y = Gelu::forward(x);                       // on the CPU or in a __device__ function
//   float dx = accumulate_product(dx, Gelu::derivative(x), dy);   // dx += gelu'(x) dy
//
// Every multiply-add is spelled: the CPU build (GCC, -march=x86-64-v3) contracts a product that
// only feeds additions into a fused multiply-add, and the CUDA build (-fmad=false) contracts
// nothing, so the functions below write as fused_multiply_add exactly the pairs GCC fused in the
// plain formulas (tests/ops/shared_math_test.cpp checks the CPU kernels against them bit for bit).
// Left to the compilers, the two devices would round differently.
#pragma once

#include "core/host_device.h"
#include "nn/fast_math.h"

namespace engine::ops {

struct Gelu {
  static constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float kKappa = 0.044715f;
  // 0.5 x (1 + tanh u) with u = kBeta (x + kKappa x^3), as x sigmoid(2u): the same function with
  // one exp and one division, and no cancellation in 1 + tanh u for negative x.
  ENGINE_HOST_DEVICE static float forward(float x) { return x / (1.0f + fast_exp(minus_two_u(x))); }
  // d/dx = s + x s (1 - s) 2u', s = sigmoid(2u), since 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s).
  ENGINE_HOST_DEVICE static float derivative(float x) {
    const float s = 1.0f / (1.0f + fast_exp(minus_two_u(x)));
    const float du = fused_multiply_add(3.0f * kKappa * x, x, 1.0f);  // 1 + 3 kKappa x^2
    return fused_multiply_add(x * s * (1.0f - s) * (2.0f * kBeta), du, s);
  }
  // -2u = -2 kBeta (x + kKappa x^3)
  ENGINE_HOST_DEVICE static float minus_two_u(float x) {
    return -2.0f * kBeta * fused_multiply_add(kKappa * x * x, x, x);
  }
};

struct Relu {
  ENGINE_HOST_DEVICE static float forward(float x) { return x > 0.0f ? x : 0.0f; }
  ENGINE_HOST_DEVICE static float derivative(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct Silu {
  ENGINE_HOST_DEVICE static float forward(float x) { return x / (1.0f + fast_exp(-x)); }
  ENGINE_HOST_DEVICE static float derivative(float x) {
    const float s = 1.0f / (1.0f + fast_exp(-x));
    return s * fused_multiply_add(x, 1.0f - s, 1.0f);  // s (1 + x (1 - s))
  }
};

// dx (+)= gradient: an accumulated product is one fused multiply-add (as GCC compiles `dx += d * dy`),
// an overwritten one a plain product.
ENGINE_HOST_DEVICE inline float accumulate_product(float dx, float derivative, float dy) {
  return fused_multiply_add(derivative, dy, dx);
}

// swiglu(a, b) = silu(a) b, and its gradients da = silu'(a) b dy, db = silu(a) dy.
ENGINE_HOST_DEVICE inline float swiglu_forward(float a, float b) { return Silu::forward(a) * b; }
ENGINE_HOST_DEVICE inline float swiglu_grad_a(float a, float b, float dy) { return Silu::derivative(a) * b * dy; }
ENGINE_HOST_DEVICE inline float swiglu_grad_b(float a, float dy) { return Silu::forward(a) * dy; }

}  // namespace engine::ops
