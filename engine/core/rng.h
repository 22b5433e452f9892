// Deterministic random numbers: Philox4x32-10, a counter-based generator, in streams keyed by the
// run seed and a purpose (initialisation, data order, dropout, ...).
//
// Counter-based means the n-th number of a stream is a pure function of (seed, purpose, n): CPU and
// CUDA kernels can produce the same numbers in any order, a resumed run continues a stream exactly
// from its saved position, and changing how many numbers one purpose draws never shifts another's.
// Philox4x32-10 is the generator of cuRAND and of PyTorch's CUDA backend.
//
//   RandomStream init(recipe.run.seed, RandomPurpose::init);
//   float w = 0.02f * init.normal();
//   uint64_t position = init.position();   // save; RandomStream(seed, purpose, position) resumes
#pragma once

#include <array>
#include <cstdint>

namespace engine {

// The splitmix64 finaliser: a 64-bit mixing function, for hashing seeds, samples and contexts
// into keys of their own.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One Philox4x32-10 block: 4 random words from a 128-bit counter and a 64-bit key (the math is
// core/philox.h's philox4x32_10, which CUDA kernels call).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

enum class RandomPurpose : uint32_t { init = 1, data = 2, dropout = 3, sampling = 4, adapter_init = 5, test = 99 };

class RandomStream {
 public:
  RandomStream(uint64_t seed, RandomPurpose purpose, uint64_t position = 0);

  uint32_t next_u32();
  double uniform();                // [0, 1), 53 random bits
  float normal();                  // standard normal (Box-Muller on two uniforms)
  uint64_t below(uint64_t bound);  // uniform in [0, bound), unbiased; bound > 0

  // How many 32-bit words have been drawn; with seed and purpose, all a stream's state.
  uint64_t position() const { return position_; }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t purpose_;
  uint64_t position_;
};

}  // namespace engine
