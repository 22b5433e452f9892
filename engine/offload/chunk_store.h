// ChunkStore: a flat array of bytes cut into equal chunks, kept in host memory or in a swap file,
// that the offloaded step streams through memory one chunk at a time.
//
//   ChunkStore store(OffloadTier::nvme, {.path = dir / "run.optimizer.swap"}, /*chunk_bytes=*/48 << 20, chunks);
//   store.stream([&](int64_t chunk, std::byte* data) { update(chunk, data); }, /*write_back=*/true);
//   store.read(offset, bytes, out);   // cold access (checkpoints, initialisation): any range
//
// In host memory a chunk is a pointer into one buffer and nothing moves. In a swap file, stream()
// keeps kChunkSlots (3) chunks in aligned buffers: while chunk i is processed, chunk i+1 is read and
// chunk i-1 written back, so the disk never waits for the update and the update waits only for the
// disk. Cold reads and writes go through one bounce buffer, read-modify-write
// at the 4 KiB grid, so any element range can be read or written without staging a chunk.
#pragma once

#include <functional>
#include <memory>

#include "offload/offload_spec.h"
#include "offload/swap_file.h"

namespace engine {

class ChunkStore {
 public:
  // `tier` is host or nvme; `swap` names the file for nvme (its bytes are set here).
  ChunkStore(OffloadTier tier, SwapSpec swap, int64_t chunk_bytes, int64_t chunks);

  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t chunks() const { return chunks_; }
  int64_t bytes() const { return chunk_bytes_ * chunks_; }
  bool in_memory() const { return !swap_; }
  const SwapFile* swap() const { return swap_.get(); }
  // Seconds the caller has waited for transfers (the part of the I/O the overlap did not hide).
  double wait_seconds() const { return wait_seconds_; }

  // Calls fn(chunk, data) on every chunk in order, each in memory for the call; with write_back
  // the chunk's (changed) bytes are stored again after it.
  void stream(const std::function<void(int64_t chunk, std::byte* data)>& fn, bool write_back);

  // Bytes [offset, offset + bytes) of the flat array.
  void read(int64_t offset, int64_t bytes, std::byte* out);
  void write(int64_t offset, int64_t bytes, const std::byte* in);

  // Asynchronous fills, for stores whose chunks are produced elsewhere (the parameter shard, by the
  // optimizer): put(chunk) returns a buffer for it, ready once any earlier use of that slot landed;
  // commit(chunk) stores it (host: already in place). wait() settles every put.
  std::byte* put(int64_t chunk);
  void commit(int64_t chunk);
  void wait();

  // Prefetched reads of ranges for the ZeRO-3 gathers: fetch(slot, offset, bytes) starts bringing
  // the range into slot `slot` of `slots`; view(slot) waits and returns where the range's first
  // byte is (host: a pointer into the buffer, nothing moves).
  void reserve_fetch_slots(int slots, int64_t largest);
  // What one fetch slot allocates for ranges of up to `largest` bytes at any offset.
  static int64_t fetch_slot_bytes(int64_t largest) { return round_up_to_alignment(largest) + kSwapAlignment; }
  void fetch(int slot, int64_t offset, int64_t bytes);
  const std::byte* view(int slot);
  int64_t fetched_bytes() const { return fetched_bytes_; }  // the ranges fetch() was asked for, so far

  // The aligned span of the file around [offset, offset + bytes): what a cold or fetched access of
  // that range transfers.
  struct Span {
    int64_t begin, end;
    int64_t bytes() const { return end - begin; }
  };
  static Span aligned(int64_t offset, int64_t bytes);
  // The buffer cold reads and writes go through (allocated at the first one).
  static constexpr int64_t kBounceBytes = int64_t(4) << 20;

 private:
  void check_range(int64_t offset, int64_t bytes) const;
  void wait_for(SwapFile::Ticket ticket);  // timed

  int64_t chunk_bytes_, chunks_;
  int64_t fetched_bytes_ = 0;
  Buffer memory_;  // host: the whole array
  std::unique_ptr<SwapFile> swap_;
  Buffer slots_[kChunkSlots];
  SwapFile::Ticket slot_ticket_[kChunkSlots] = {};
  bool slot_busy_[kChunkSlots] = {};
  Buffer bounce_;
  struct Fetch {
    Buffer buffer;
    SwapFile::Ticket ticket = 0;
    int64_t skip = 0;  // the range's first byte in the buffer
    const std::byte* host = nullptr;
    bool pending = false;
  };
  std::vector<Fetch> fetches_;
  double wait_seconds_ = 0;
};

}  // namespace engine
