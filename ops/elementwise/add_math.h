// add's element, written once for the CPU kernel (elementwise/add.cpp) and the CUDA kernel
// (elementwise/add.cu): one rounded fp32 addition on both.
#pragma once

#include "core/host_device.h"

namespace engine::ops {

ENGINE_HOST_DEVICE inline float add_values(float a, float b) { return a + b; }

}  // namespace engine::ops
