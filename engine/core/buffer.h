// Buffer: an aligned, zero-filled block of host memory that owns its bytes; movable, and a
// moved-from buffer is empty. The allocation is rounded up to the alignment (and is at least one
// alignment unit), so a transfer of bytes() rounded up to it stays inside: the executor's arena
// and inputs use the default 64 bytes (a cache line), the swap files' staging 4096
// (kSwapAlignment, what O_DIRECT asks).
//
//   Buffer arena(plan.arena_bytes);                        // 64-byte aligned, zeros
//   Buffer staging(chunk_bytes, kSwapAlignment);  // for O_DIRECT transfers
//   float* x = arena.f32();
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace engine {

class Buffer {
 public:
  static constexpr int64_t kDefaultAlignment = 64;

  Buffer() = default;
  explicit Buffer(int64_t bytes, int64_t alignment = kDefaultAlignment) : bytes_(bytes) {
    if (bytes < 0) throw std::invalid_argument("negative buffer size " + std::to_string(bytes));
    const int64_t rounded = std::max<int64_t>((bytes + alignment - 1) / alignment * alignment, alignment);
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(size_t(alignment), size_t(rounded))));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, size_t(rounded));
  }
  Buffer(Buffer&& other) noexcept : data_(std::move(other.data_)), bytes_(std::exchange(other.bytes_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    data_ = std::move(other.data_);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
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
