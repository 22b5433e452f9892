// MirrorPool: which page-locked block mirrors each arena buffer of a run staged through the host
// (runtime/device_runner.h, "staged"), bookkeeping only. A buffer takes the smallest free block
// that holds it, or a new block, and keeps it until it is released (from its gather to its use,
// from its reduce-scatter to the unit's wait); blocks are never freed, so the pool grows to the
// most buffers in flight at once, not to the model. The CUDA runner attaches a page-locked block
// and an event to each index; the memory plan replays the plan's actions through the same pool
// (trainer/session.h staged_mirror_bytes), so the planned bytes are the runner's.
//
//   MirrorPool pool;
//   const MirrorPool::Taken t = pool.acquire(buffer, bytes);   // t.added: a new block t.block
//   pool.release(buffer);
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/error.h"
#include "graph/graph.h"

namespace engine {

class MirrorPool {
 public:
  struct Taken {
    size_t block;
    bool added;  // a new block: the pool grew by `bytes`
  };
  Taken acquire(ValueId buffer, int64_t bytes) {
    ENGINE_CHECK(!held_.count(buffer), "a staged buffer is reused before it was released");
    size_t best = blocks_.size();
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (!blocks_[i].busy && blocks_[i].bytes >= bytes &&
          (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes))
        best = i;
    const bool added = best == blocks_.size();
    if (added) blocks_.push_back({bytes, false});
    blocks_[best].busy = true;
    held_[buffer] = best;
    return {best, added};
  }
  size_t held(ValueId buffer) const {  // the block that mirrors `buffer`
    const auto found = held_.find(buffer);
    ENGINE_CHECK(found != held_.end(), "a staged buffer is used before it was gathered");
    return found->second;
  }
  void release(ValueId buffer) {
    const auto found = held_.find(buffer);
    ENGINE_CHECK(found != held_.end(), "a staged buffer is released twice");
    blocks_[found->second].busy = false;
    held_.erase(found);
  }
  bool idle() const { return held_.empty(); }
  int64_t bytes() const {  // every block's
    int64_t total = 0;
    for (const Block& b : blocks_) total += b.bytes;
    return total;
  }

 private:
  struct Block {
    int64_t bytes;
    bool busy;
  };
  std::vector<Block> blocks_;
  std::map<ValueId, size_t> held_;
};

}  // namespace engine
