// Philox4x32-10 (core/rng.h) as one function for the CPU and CUDA kernels: 4 random words from a
// 128-bit counter and a 64-bit key, integer arithmetic only, so both devices draw the same words.
//
//   PhiloxWords w = philox4x32_10({block, salt, step, micro_step}, {key0, key1});   // w.word[0..3]
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace engine {

struct PhiloxWords {
  uint32_t word[4];
};
struct PhiloxKey {
  uint32_t word[2];
};

ENGINE_HOST_DEVICE inline PhiloxWords philox4x32_10(PhiloxWords counter, PhiloxKey key) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter.word[0], c1 = counter.word[1], c2 = counter.word[2], c3 = counter.word[3];
  uint32_t k0 = key.word[0], k1 = key.word[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c0;
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(product1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(product1);
    const uint32_t n2 = static_cast<uint32_t>(product0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(product0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

}  // namespace engine
