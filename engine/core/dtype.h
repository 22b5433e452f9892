// DType: the element types tensors hold, with their sizes, names and the 16-bit float conversions.
//
// bf16 and f16 are stored as raw uint16_t bits; to_float/from_float convert with round-to-nearest-
// even, matching PyTorch and the hardware conversions, so CPU and CUDA kernels agree bit for bit.
//
//   DType t = parse_dtype("bf16").value();     // DType::bf16
//   size_t bytes = dtype_size(t) * numel;       // 2 bytes per element
//   uint16_t bits = float_to_bf16(3.14159f);    // 0x4049
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace engine {

enum class DType : uint8_t { f32, f16, bf16, i32, i64, u16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u16:
      return 2;
  }
  return 0;
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

std::string_view dtype_name(DType t);                     // "f32", "bf16", ...
std::optional<DType> parse_dtype(std::string_view name);  // accepts the names above

// IEEE binary32 <-> bfloat16 (the top 16 bits), round to nearest even; NaN stays NaN.
uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);

// IEEE binary32 <-> binary16, round to nearest even, with subnormals, overflow to infinity.
uint16_t float_to_f16(float value);
float f16_to_float(uint16_t bits);

}  // namespace engine
