// A stateless pseudo-random permutation of [0, n): a 4-round Feistel network over the next power
// of two, with cycle-walking back into range. position -> permuted index with no table, so any
// epoch's shuffle is computed on demand from (seed, epoch).
#pragma once

#include <cstdint>

namespace engine {

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t position) const;

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_, key_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace engine
