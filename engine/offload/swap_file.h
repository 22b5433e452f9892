// SwapFile: the NVMe tier's scratch file. Optimizer state and parameters that fit neither device nor
// host memory live at fixed offsets of one preallocated file and move between it and host buffers
// through io_uring, asynchronously: read() and write() return a ticket at once, wait(ticket) returns
// when those bytes have arrived. The offload plan decides the offsets; this class only moves bytes.
//
//   SwapFile swap({.path = "/nvme/run-7/rank-0.swap", .bytes = 3 * (int64_t{1} << 30)});
//   Buffer moments(64 << 20, kSwapAlignment), next(64 << 20, kSwapAlignment);  // aligned for O_DIRECT
//   SwapFile::Ticket out = swap.write(0, moments.data(), moments.bytes());
//   SwapFile::Ticket in = swap.read(64 << 20, next.data(), next.bytes());   // prefetch the next unit
//   swap.wait(out);                                           // moments may be reused now
//   swap.wait(in);                                            // next holds the bytes
//
// Requests are split into blocks of at most SwapSpec::block_size bytes; at most queue_depth blocks
// are in flight, and the rest are submitted as completions arrive (inside read(), write() and the
// waits), so tickets may finish out of order. One thread owns a SwapFile; it is not thread-safe.
// Offsets, sizes and buffer addresses must be multiples of kSwapAlignment (an internal error
// otherwise: the plan places every tensor on that grid).
//
// The file is opened with O_DIRECT, so transfers bypass the page cache. Where the file system
// refuses O_DIRECT (ramfs, some network and FUSE file systems) it is opened without it, a warning is
// logged once per directory and direct() is false. Writes are never fsynced: a swap file is scratch
// that dies with the run (the destructor unlinks it), not durable state; checkpoints are written
// elsewhere. Everything a user can get wrong (a missing or read-only directory, too little space, a
// failed transfer, the file deleted under a running job, io_uring blocked by a seccomp profile) is
// a UserError that names the file.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/buffer.h"

struct io_uring;  // liburing's, kept out of this header
struct io_uring_cqe;

namespace engine {

// Offsets, sizes and buffer addresses of every request are multiples of this (the logical block
// size O_DIRECT needs on any current device, and the page size).
inline constexpr int64_t kSwapAlignment = 4096;

// `bytes` rounded up to the next multiple of kSwapAlignment.
inline constexpr int64_t round_up_to_alignment(int64_t bytes) {
  return (bytes + kSwapAlignment - 1) / kSwapAlignment * kSwapAlignment;
}

struct SwapSpec {
  std::filesystem::path path;    // the file to create (its directory must exist)
  int64_t bytes = 0;             // preallocated size (rounded up to kSwapAlignment)
  int queue_depth = 8;           // requests in flight
  int64_t block_size = 1 << 20;  // one request moves at most this many bytes (a multiple of kSwapAlignment)
};

class SwapFile {
 public:
  // Creates and preallocates the file (fallocate), opens it with O_DIRECT and sets up the ring.
  // A file already at `path` is a UserError and stays untouched: it may be another rank's swap
  // file (two ranks given one path) or a user's file behind a mistyped path. A run killed with
  // SIGKILL leaves its swap file behind, and the message says to remove it.
  explicit SwapFile(const SwapSpec& spec);
  // Waits for requests in flight, then closes and unlinks the file (unless another file has taken
  // its name since).
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  using Ticket = uint64_t;
  Ticket read(int64_t offset, void* buffer, int64_t bytes);         // asynchronous
  Ticket write(int64_t offset, const void* buffer, int64_t bytes);  // asynchronous
  // Until every block of that request is done; throws the request's UserError if one failed (after
  // all its blocks in flight have landed, so the buffer is free either way). Waiting for a ticket
  // that already finished returns at once.
  void wait(Ticket ticket);
  // Until every request is done; throws the first failure among them.
  void wait_all();

  // Throws a UserError when the file was deleted or replaced since it was opened (someone cleaned
  // the scratch directory under a running job), before the next read returns garbage.
  void check_present() const;

  const std::filesystem::path& path() const { return path_; }
  bool direct() const { return direct_; }
  int64_t bytes() const { return bytes_; }            // the preallocated size
  int64_t bytes_read() const { return bytes_read_; }  // totals since creation
  int64_t bytes_written() const { return bytes_written_; }

 private:
  struct Block {  // one piece of a request: at most block_size bytes
    Ticket ticket;
    bool write;
    int64_t offset;
    std::byte* buffer;
    int64_t bytes;
  };
  struct Request {
    int blocks_left = 0;        // queued or in flight
    std::string error;          // the first failure, empty while all is well
    int64_t submitted_ns = -1;  // while a trace records (telemetry/trace.h)
    bool write = false;
    int64_t bytes = 0;
  };

  Ticket submit(bool write, int64_t offset, std::byte* buffer, int64_t bytes);
  void fill_ring();                  // moves queued blocks into free slots and submits them
  void complete(io_uring_cqe* cqe);  // accounts one completion; resubmits the rest of a short one
  void reap(bool block);             // handles available completions (waits for one when `block`)
  void finish_block(const Block& block, const std::string& error);
  int in_flight() const { return queue_depth_ - static_cast<int>(free_slots_.size()); }
  void release() noexcept;  // waits for blocks in flight, closes the ring and the file, unlinks it

  std::filesystem::path path_;
  int64_t bytes_ = 0;
  int queue_depth_ = 0;
  int64_t block_size_ = 0;
  int fd_ = -1;
  bool created_ = false;  // this object created the file at path_, so it removes it
  bool direct_ = true;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  std::unique_ptr<io_uring> ring_;  // null until io_uring_queue_init succeeded

  Ticket next_ticket_ = 1;
  std::deque<Block> queued_;                      // not yet submitted, in request order
  std::vector<Block> slots_;                      // in flight, indexed by the SQE's user_data
  std::vector<int> free_slots_;                   // indices into slots_
  std::unordered_map<Ticket, Request> requests_;  // unfinished or failed and not yet waited for
  int64_t bytes_read_ = 0;
  int64_t bytes_written_ = 0;
};

}  // namespace engine
