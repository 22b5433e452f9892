// Pointwise activations and their gradients. The math of each lives once, in a functor shared by
// forward and backward kernels, CPU and CUDA (nn/activation_math.h).
//
//   gelu  (tanh approximation, as GPT-2):  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu:                                  max(x, 0)
//   silu:                                  x sigmoid(x)
//   swiglu(a, b) = silu(a) * b             (Llama's feed-forward gate; a and b have one shape)
#pragma once

#include "nn/activation_math.h"
#include "op_util.h"

namespace engine::ops {

// The functors Gelu, Relu and Silu (forward, derivative) live in nn/activation_math.h, shared with
// the CUDA kernels.

ValueId gelu(Graph& g, ValueId x, const std::string& name);
ValueId relu(Graph& g, ValueId x, const std::string& name);
ValueId silu(Graph& g, ValueId x, const std::string& name);
ValueId swiglu(Graph& g, ValueId a, ValueId b, const std::string& name);

extern const OpDef kGelu, kGeluBackward, kRelu, kReluBackward, kSilu, kSiluBackward, kSwiglu, kSwigluBackward;

}  // namespace engine::ops
