// Durable file I/O for checkpoints: bytes that are on disk when a call returns, and a checksum.
//
// write_durably() writes a whole file and fsyncs it; sync_directory() makes a rename or a new
// entry in a directory durable. Errors (a full disk, a vanished directory) throw CheckpointIoError
// naming the path and the system's reason, so a caller can keep the previous checkpoint and go on.
// Checksums are XXH3-64 (libxxhash): fast enough to verify at disk speed.
//
//   write_durably(tmp / "rank-00000.bin", image.data(), image.size());
//   sync_directory(tmp);
//   std::filesystem::rename(tmp, final_dir);  sync_directory(final_dir.parent_path());
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"

struct XXH3_state_s;  // libxxhash's, kept out of this header

namespace engine {

class CheckpointIoError : public UserError {
 public:
  using UserError::UserError;
};

// Writes `size` bytes to `path` (created or truncated) and fsyncs the file.
void write_durably(const std::filesystem::path& path, const void* data, size_t size);

// A file written a piece at a time (state streamed from where it lives), checksummed on the way and
// fsynced by finish(); errors throw CheckpointIoError naming the path, like write_durably.
class DurableWriter {
 public:
  explicit DurableWriter(const std::filesystem::path& path);
  ~DurableWriter();
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;
  void append(const void* data, size_t size);
  uint64_t finish();  // fsync and close; the checksum of everything appended
  int64_t bytes() const { return bytes_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  ::XXH3_state_s* hash_ = nullptr;
};
void sync_directory(const std::filesystem::path& dir);

uint64_t checksum(const void* data, size_t size);
std::string checksum_hex(uint64_t sum);

// Reads a whole file in chunks, handing each to `chunk(data, bytes, offset)`; returns the checksum
// of everything read. Throws CheckpointIoError when the file cannot be read.
uint64_t read_file_chunks(const std::filesystem::path& path,
                          const std::function<void(const std::byte*, size_t, int64_t)>& chunk);

}  // namespace engine
