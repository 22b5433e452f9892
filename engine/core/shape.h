// Shape: the extents of a dense, row-major tensor.
//
//   Shape s{8, 64, 384};   // (B, T, C)
//   s.numel() == 196608;  s.last() == 384;  s.str() == "(8, 64, 384)"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace engine {

struct Shape {
  std::vector<int64_t> dims;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims(d) {}
  explicit Shape(std::vector<int64_t> d) : dims(std::move(d)) {}

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  size_t rank() const { return dims.size(); }
  int64_t operator[](size_t i) const { return dims[i]; }
  int64_t last() const { return dims.back(); }
  // Product of all but the last dimension: the number of rows of a row-major matrix view.
  int64_t rows() const { return dims.empty() ? 1 : numel() / dims.back(); }
  bool operator==(const Shape&) const = default;

  std::string str() const {
    std::string out = "(";
    for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
    return out + ")";
  }
};

}  // namespace engine
