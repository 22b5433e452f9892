// Buffer: an aligned, zero-initialised block of host memory that owns its bytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace engine {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t bytes) : bytes_(bytes) {
    if (bytes <= 0) return;
    size_t rounded = (size_t(bytes) + 63) / 64 * 64;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, rounded);
  }

  std::byte* data() const { return data_.get(); }
  float* f32() const { return reinterpret_cast<float*>(data_.get()); }
  int64_t bytes() const { return bytes_; }
  void zero() {
    if (data_) std::memset(data_.get(), 0, size_t(bytes_));
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  int64_t bytes_ = 0;
};

}  // namespace engine
