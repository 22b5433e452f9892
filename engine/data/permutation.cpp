#include "data/permutation.h"

namespace engine {

namespace {

uint64_t round_function(uint64_t x, uint64_t key) {
  x ^= key;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 29);
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  int bits = 2;
  while ((uint64_t(1) << bits) < n && bits < 62) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

uint64_t Permutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t round = 0; round < 4; ++round) {
    uint64_t next = left ^ (round_function(right, key_ + round * 0x9e3779b97f4a7c15ull) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t position) const {
  uint64_t x = position;
  do {
    x = encrypt(x);
  } while (x >= n_);  // the walk stays inside the cycle of `position`, so it ends in range
  return x;
}

}  // namespace engine
