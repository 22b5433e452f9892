// What the kernels that call oneDNN primitives share: the one CPU engine of the process, and the
// oneDNN data type of an engine float type.
//
//   dnnl::memory::desc md({n}, onednn_type(DType::bf16), dnnl::memory::format_tag::a);
//   dnnl::stream stream(onednn_cpu());
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "core/dtype.h"

namespace engine::ops {

inline dnnl::engine& onednn_cpu() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// bf16, f16, and f32 for every other (float) type.
inline dnnl::memory::data_type onednn_type(DType type) {
  switch (type) {
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

}  // namespace engine::ops
