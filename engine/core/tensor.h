// Tensor: plain data describing a dense array in memory: where it is, its shape and dtype, and on
// which device. It owns nothing; storage belongs to a Buffer (host memory), the planner's arena or
// a parameter store. Kernels receive values as tensors through their KernelContext.
//
//   Tensor t = ctx.tensor(node.inputs[0]);       // a view of a value of the step being run
//   if (t.dtype == DType::bf16) ... t.as<uint16_t>()[i] ...
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/shape.h"

namespace engine {

struct Device {
  enum class Kind : uint8_t { cpu, cuda } kind = Kind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device;

  int64_t numel() const { return shape.numel(); }
  int64_t bytes() const { return numel() * int64_t(dtype_size(dtype)); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace engine
