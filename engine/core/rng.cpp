#include "core/rng.h"

#include <cmath>
#include <numbers>

#include "core/philox.h"

namespace engine {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  const PhiloxWords w = philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}}, {{key[0], key[1]}});
  return {w.word[0], w.word[1], w.word[2], w.word[3]};
}

RandomStream::RandomStream(uint64_t seed, RandomPurpose purpose, uint64_t position)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
      purpose_(static_cast<uint32_t>(purpose)),
      position_(position) {}

uint32_t RandomStream::next_u32() {
  // Word i of the stream is word (i % 4) of the block at counter (i / 4, purpose).
  uint64_t block = position_ >> 2;
  auto words = philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), purpose_, 0}, key_);
  return words[position_++ & 3];
}

double RandomStream::uniform() {
  uint64_t high = next_u32() >> 5;  // 27 bits
  uint64_t low = next_u32() >> 6;   // 26 bits
  return static_cast<double>((high << 26) | low) * 0x1p-53;
}

float RandomStream::normal() {
  // Two uniforms, four words: at a block boundary (as every draw of a stream of normals is) one
  // Philox block gives all four, the words next_u32 would return one by one.
  std::array<uint32_t, 4> w;
  if ((position_ & 3) == 0) {
    const uint64_t block = position_ >> 2;
    w = philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), purpose_, 0}, key_);
    position_ += 4;
  } else {
    for (uint32_t& word : w) word = next_u32();
  }
  const auto uniform_of = [](uint32_t high, uint32_t low) {
    return static_cast<double>((uint64_t(high >> 5) << 26) | (low >> 6)) * 0x1p-53;  // as uniform()
  };
  double u1 = 1.0 - uniform_of(w[0], w[1]);  // (0, 1]: log is finite
  double u2 = uniform_of(w[2], w[3]);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

uint64_t RandomStream::below(uint64_t bound) {
  // Rejection from 64 random bits: the largest multiple of bound is accepted, the rest redrawn.
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  while (true) {
    uint64_t value = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
    if (value < limit) return value % bound;
  }
}

}  // namespace engine
