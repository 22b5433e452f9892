#include "core/dtype.h"

#include <bit>
#include <cstring>

namespace engine {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u16:
      return "u16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u16})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);                                             // ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_f16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (magnitude < 0x38800000u) {
    // Result is subnormal (or zero): shift the 24-bit significand into place, rounding to even.
    if (magnitude < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    uint32_t exponent = magnitude >> 23;
    uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;  // value = significand x 2^(exponent - 150) = k x 2^-24
    uint32_t half = 1u << (shift - 1);
    uint32_t result = significand >> shift;
    uint32_t remainder = significand & ((1u << shift) - 1u);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t rebiased = magnitude - (112u << 23);  // exponent bias 127 -> 15
  uint32_t result = rebiased >> 13;
  uint32_t remainder = rebiased & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;  // may carry into the exponent
  return static_cast<uint16_t>(sign | result);
}

float f16_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t significand = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (significand << 13));  // inf/NaN
  if (exponent == 0) {
    if (significand == 0) return std::bit_cast<float>(sign);
    float value = static_cast<float>(significand) * 0x1p-24f;  // subnormal: exact in binary32
    return sign ? -value : value;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (significand << 13));
}

}  // namespace engine
