#include "optim/update_chunks.h"

#include <algorithm>

namespace engine {
namespace {

// The packs of a chunk whose arrays start at these addresses (update_chunks.h UpdateChunk).
void place_packs(UpdateChunk& c, int64_t copy_size, int64_t grad_size) {
  const auto offset = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16; };
  const uintptr_t at = offset(c.w);
  const int64_t head = std::min(c.n, int64_t((16 - at) % 16) / 4);
  const auto g_at = reinterpret_cast<uintptr_t>(static_cast<const std::byte*>(c.g) + head * grad_size);
  const bool packable =
      at % 4 == 0 && g_at % uintptr_t(4 * grad_size) == 0 && (!c.m || offset(c.m) == at) && (!c.v || offset(c.v) == at);
  if (!packable) {
    c.head = c.n;
    c.packs = 0;
    return;
  }
  c.head = head;
  c.packs = (c.n - c.head) / 4;
  // A pack's copy is 4 elements: one store where that many bytes are aligned to their size.
  if (!c.copy) return;
  const auto copy_at = reinterpret_cast<uintptr_t>(static_cast<std::byte*>(c.copy) + c.head * copy_size);
  c.copy_packs = copy_at % uintptr_t(4 * copy_size) == 0 ? 1 : 0;
}

}  // namespace

std::vector<UpdateChunk> plan_update_chunks(const std::vector<Segment>& segments,
                                            const std::vector<UpdateArrays>& units, int64_t copy_size,
                                            int64_t grad_size) {
  std::vector<UpdateChunk> chunks;
  for (const Segment& s : segments) {
    const UpdateArrays& a = units.at(s.unit);
    for (int64_t begin = s.begin; begin < s.end; begin += kUpdateChunk) {
      UpdateChunk c;
      c.w = a.w + begin;
      c.g = static_cast<const std::byte*>(a.g) + begin * grad_size;
      c.m = a.m ? a.m + begin : nullptr;
      c.v = a.v ? a.v + begin : nullptr;
      c.copy = a.copy ? a.copy + begin * copy_size : nullptr;
      c.n = std::min(kUpdateChunk, s.end - begin);
      c.decay = s.decay ? 1 : 0;
      place_packs(c, copy_size, grad_size);
      chunks.push_back(c);
    }
  }
  return chunks;
}

}  // namespace engine
