// OffloadedState: one rank's per-parameter state that lives outside the memory the step computes
// in: the optimizer's records (fp32 masters where they move, and the optimizer state) and, at ZeRO
// stage 3, the parameter shard the gathers read.
//
// The rank's optimizer ranges of every wrap unit are laid end to end as one flat run of elements
// (unit u starts at unit_base(u)), cut into chunks of spec.chunk_size elements. Chunk c of the
// optimizer store holds, kind after kind, each kind's values of elements [c * C, (c + 1) * C), so
// one transfer brings everything the update of those elements reads; the parameter store holds the
// same elements in the compute type.
//
//   OffloadedState state(spec, ranges, {"master", "exp_avg", "exp_avg_sq"}, DType::bf16, /*shard=*/false);
//   state.update([&](const OffloadedState::Chunk& c) { adamw(c.kinds[0], grads + c.first, ...); }, true);
//   state.read(state.kind("exp_avg"), unit, first, count, out);   // checkpoints: any range, no staging
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "offload/chunk_store.h"

namespace engine {

class OffloadedState {
 public:
  // ranges: each unit's optimizer range in elements; kinds: the fp32 kinds of the optimizer store
  // (none: no optimizer store); param_shard: the parameter shard is offloaded (spec.parameters) in
  // param_dtype.
  OffloadedState(const OffloadSpec& spec, std::vector<int64_t> ranges, std::vector<std::string> kinds,
                 DType param_dtype, bool param_shard);

  const OffloadSpec& spec() const { return spec_; }
  const std::vector<std::string>& kinds() const { return kinds_; }
  bool has(const std::string& kind) const;
  size_t kind(const std::string& name) const;  // ENGINE_CHECK that it is held
  int64_t unit_base(size_t unit) const { return base_[unit]; }
  int64_t elements() const { return elements_; }
  // Chunks of `chunk_size` elements that hold `elements`.
  static int64_t chunk_count(int64_t elements, int64_t chunk_size) { return (elements + chunk_size - 1) / chunk_size; }

  // Elements [first, first + count) of unit `unit`'s optimizer range, of one kind.
  void read(size_t kind, size_t unit, int64_t first, int64_t count, float* out);
  void write(size_t kind, size_t unit, int64_t first, int64_t count, const float* in);

  // One chunk of the flat run in memory: elements [first, first + count), kind k at kinds[k].
  struct Chunk {
    int64_t index, first, count;
    std::vector<float*> kinds;
  };
  // Every chunk of the optimizer store in order (the step); with write_back the chunk is stored again.
  void update(const std::function<void(const Chunk&)>& fn, bool write_back);
  // The chunked loop without an optimizer store (kinds empty), for callers that only produce shards.
  void for_each_chunk(const std::function<void(const Chunk&)>& fn);

  // The offloaded parameter shard (null when the shard stays in memory).
  ChunkStore* params() { return params_.get(); }
  const ChunkStore* params() const { return params_.get(); }
  int64_t param_bytes(int64_t elements) const { return elements * int64_t(dtype_size(param_dtype_)); }
  DType param_dtype() const { return param_dtype_; }
  void retype_params(DType to) { param_dtype_ = to; }  // fp16 -> bf16: same size

  // The swap files in use, for the start-up report and the deletion check.
  std::vector<const SwapFile*> swap_files() const;
  void check_present() const;
  int64_t bytes_read() const;
  int64_t bytes_written() const;
  double wait_seconds() const;  // waited for swap transfers in the streamed step and the fetches
  int64_t chunks_updated() const { return chunks_updated_; }  // chunks update() has handed out so far
  // Bytes of the offloaded parameter shard the ZeRO-3 gathers have read so far (0 without one).
  int64_t parameter_bytes_fetched() const { return params_ ? params_->fetched_bytes() : 0; }

 private:
  SwapSpec swap_spec(const std::string& what) const;
  // The runs of the optimizer store (byte offset, bytes) that hold elements [first, first + count)
  // of one kind of one unit: a kind's elements are contiguous within a chunk only.
  void for_each_run(size_t kind, size_t unit, int64_t first, int64_t count,
                    const std::function<void(int64_t offset, int64_t bytes)>& fn) const;

  OffloadSpec spec_;
  std::vector<int64_t> ranges_, base_;
  int64_t elements_ = 0, chunks_ = 0, chunks_updated_ = 0;
  std::vector<std::string> kinds_;
  DType param_dtype_;
  std::unique_ptr<ChunkStore> optimizer_, params_;
};

}  // namespace engine
