// ShardLayout: which contiguous range of each wrap unit's flat buffer a rank owns.
//
// Every unit's buffer is padded to a multiple of world x kShardBlock elements, so each of the
// `world` ranks owns an equal, aligned slice [rank * shard, (rank + 1) * shard) made of whole
// blocks. The block is also the unit of the gradient norm's partial sums. A unit's first
// value_blocks(u) blocks hold its values, whatever the world size; the blocks after them are
// padding (zeros), more of them at larger world sizes, so the norm sums the value blocks alone
// (dist/zero_step.h without_padding_blocks): the same list, in the same order, at every world size
// and stage. The optimizer, the parameter store, the ZeRO
// plan and `engine plan` read shard offsets from here and nowhere else.
//
//   ShardLayout layout(graph.units(), /*world=*/4, /*rank=*/1);
//   int64_t first = layout.begin(u), count = layout.shard(u);   // rank 1's elements of unit u
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace engine {

inline constexpr int64_t kShardBlock = 1024;  // elements

class ShardLayout {
 public:
  ShardLayout() = default;
  ShardLayout(const std::vector<Unit>& units, int world, int rank) : world_(world), rank_(rank) {
    const int64_t quantum = int64_t(world) * kShardBlock;
    for (const Unit& unit : units) {
      const int64_t padded = (unit.numel + quantum - 1) / quantum * quantum;
      padded_.push_back(padded);
      total_padded_ += padded;
      value_blocks_.push_back((unit.numel + kShardBlock - 1) / kShardBlock);
    }
  }
  int world() const { return world_; }
  int rank() const { return rank_; }
  int64_t padded(size_t unit) const { return padded_[unit]; }              // the unit's buffer, all ranks
  int64_t shard(size_t unit) const { return padded_[unit] / world_; }      // one rank's slice
  int64_t begin(size_t unit) const { return rank_ * shard(unit); }         // this rank's first element
  int64_t value_blocks(size_t unit) const { return value_blocks_[unit]; }  // blocks holding values
  int64_t total_padded() const { return total_padded_; }
  int64_t total_shard() const { return total_padded_ / world_; }
  size_t units() const { return padded_.size(); }

 private:
  int world_ = 1, rank_ = 0;
  std::vector<int64_t> padded_, value_blocks_;
  int64_t total_padded_ = 0;
};

}  // namespace engine
