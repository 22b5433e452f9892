#include "offload/swap_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>

#include "core/error.h"
#include "telemetry/trace.h"

namespace engine {

namespace {

bool aligned(int64_t value) { return value % kSwapAlignment == 0; }

std::string size_text(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%lld bytes (%.1f MiB)", static_cast<long long>(bytes),
                static_cast<double>(bytes) / (1 << 20));
  return text;
}

std::string system_reason(int error) { return std::strerror(error); }

// The space an unprivileged writer may still use in `dir`, or -1 when the file system does not say
// (ramfs and some FUSE file systems report no blocks at all).
int64_t available_bytes(const std::filesystem::path& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0 || fs.f_blocks == 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

// One warning per directory and process: every rank's and every tier's swap file in a directory
// that refuses O_DIRECT has the same cause, and one line says it.
void warn_once(const std::filesystem::path& dir, const char* what, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(dir.string() + '\n' + what).second) spdlog::warn("{}", message);
}

}  // namespace

SwapFile::SwapFile(const SwapSpec& spec)
    : path_(spec.path),
      bytes_(round_up_to_alignment(spec.bytes)),
      queue_depth_(spec.queue_depth),
      block_size_(spec.block_size) {
  ENGINE_CHECK(spec.bytes > 0, "swap file size " + std::to_string(spec.bytes));
  ENGINE_CHECK(queue_depth_ >= 1 && queue_depth_ <= 4096, "queue depth " + std::to_string(queue_depth_));
  ENGINE_CHECK(block_size_ > 0 && block_size_ <= (1 << 30) && aligned(block_size_),
               "block size " + std::to_string(block_size_));
  const std::string name = "swap file " + path_.string();
  std::filesystem::path dir = path_.parent_path();
  if (dir.empty()) dir = ".";

  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) throw UserError(name + ": directory " + dir.string() + " does not exist");
    throw UserError(name + ": cannot reach directory " + dir.string() + ": " + system_reason(errno));
  }
  if (!S_ISDIR(st.st_mode)) throw UserError(name + ": " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw UserError(name + ": directory " + dir.string() + " is not writable (" + system_reason(errno) + ")");
  if (const int64_t available = available_bytes(dir); available >= 0 && available < bytes_)
    throw UserError(name + ": not enough space: needs " + size_text(bytes_) + ", " + size_text(available) +
                    " available in " + dir.string());

  try {
    // O_EXCL: an existing file may be another rank's swap file or a user's file behind a mistyped
    // path; neither is ours to truncate or delete.
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0600);
    if (fd_ < 0 && errno == EINVAL) {
      // The file system refuses O_DIRECT; the failed open may already have created the file.
      direct_ = false;
      fd_ = ::open(path_.c_str(), flags, 0600);
      if (fd_ < 0 && errno == EEXIST) fd_ = ::open(path_.c_str(), flags & ~O_EXCL, 0600);
    }
    if (fd_ < 0) {
      const int error = errno;
      if (error == EEXIST)
        throw UserError(name +
                        " already exists: another process may be using it, or a run that crashed left it "
                        "behind (remove it if no run uses it)");
      if (error == EACCES || error == EROFS || error == EPERM)
        throw UserError(name + ": directory " + dir.string() + " is not writable (" + system_reason(error) + ")");
      throw UserError(name + ": cannot create: " + system_reason(error));
    }
    created_ = true;
    struct stat file {};
    if (::fstat(fd_, &file) != 0) throw UserError(name + ": fstat: " + system_reason(errno));
    device_ = file.st_dev;
    inode_ = file.st_ino;
    if (!direct_)
      warn_once(dir, "no O_DIRECT",
                "the file system of " + dir.string() +
                    " does not support O_DIRECT: swap files there go through the page cache (" + name + ")");

    if (::fallocate(fd_, 0, 0, bytes_) != 0) {
      const int error = errno;
      if (error == ENOSPC)
        throw UserError(name + ": not enough space to preallocate " + size_text(bytes_) + " (" + system_reason(error) +
                        "); " + size_text(std::max<int64_t>(available_bytes(dir), 0)) + " available in " +
                        dir.string());
      if (error != EOPNOTSUPP)
        throw UserError(name + ": cannot preallocate " + size_text(bytes_) + ": " + system_reason(error));
      // No preallocation here (ramfs, some network file systems): the size is set, and a full disk
      // surfaces as a failed write naming this file.
      if (::ftruncate(fd_, bytes_) != 0)
        throw UserError(name + ": cannot set the size to " + size_text(bytes_) + ": " + system_reason(errno));
      warn_once(dir, "no fallocate",
                "the file system of " + dir.string() + " cannot preallocate swap files (" + name + ")");
    }

    auto ring = std::make_unique<io_uring>();
    if (const int ret = io_uring_queue_init(static_cast<unsigned>(queue_depth_), ring.get(), 0); ret < 0)
      throw UserError(name + ": io_uring is unavailable (io_uring_queue_init: " + system_reason(-ret) +
                      "); the NVMe tier needs it. A container's seccomp profile may block io_uring_setup: "
                      "allow it, or keep the offloaded state in host memory");
    ring_ = std::move(ring);
  } catch (...) {
    release();
    throw;
  }
  slots_.resize(static_cast<size_t>(queue_depth_));
  for (int slot = queue_depth_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

SwapFile::~SwapFile() { release(); }

void SwapFile::release() noexcept {
  if (ring_) {
    // The kernel may still write into callers' buffers: every block in flight must land first.
    while (in_flight() > 0) {
      io_uring_cqe* cqe = nullptr;
      const int ret = io_uring_wait_cqe(ring_.get(), &cqe);
      if (ret == -EINTR) continue;
      if (ret < 0) break;
      free_slots_.push_back(static_cast<int>(io_uring_cqe_get_data64(cqe)));
      io_uring_cqe_seen(ring_.get(), cqe);
    }
    io_uring_queue_exit(ring_.get());
    ring_.reset();
  }
  queued_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (created_) {
    // Only our own inode: if the name now belongs to another file, that file is not ours to remove.
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && st.st_dev == device_ && st.st_ino == inode_) ::unlink(path_.c_str());
    created_ = false;
  }
}

SwapFile::Ticket SwapFile::read(int64_t offset, void* buffer, int64_t bytes) {
  return submit(false, offset, static_cast<std::byte*>(buffer), bytes);
}

SwapFile::Ticket SwapFile::write(int64_t offset, const void* buffer, int64_t bytes) {
  // io_uring only reads from the buffer of a write; the cast lets both directions share Block.
  return submit(true, offset, static_cast<std::byte*>(const_cast<void*>(buffer)), bytes);
}

SwapFile::Ticket SwapFile::submit(bool write, int64_t offset, std::byte* buffer, int64_t bytes) {
  ENGINE_CHECK(aligned(offset) && aligned(bytes) && aligned(reinterpret_cast<intptr_t>(buffer)),
               "swap request not aligned to " + std::to_string(kSwapAlignment) + " bytes: offset " +
                   std::to_string(offset) + ", size " + std::to_string(bytes));
  ENGINE_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_,
               "swap request [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                   ") outside the file's " + std::to_string(bytes_) + " bytes");
  const Ticket ticket = next_ticket_++;
  if (bytes == 0) return ticket;
  Request& request = requests_[ticket];
  if (trace::recording()) {
    request.submitted_ns = trace::now_ns();
    request.write = write;
    request.bytes = bytes;
  }
  for (int64_t done = 0; done < bytes; done += block_size_) {
    queued_.push_back({ticket, write, offset + done, buffer + done, std::min(block_size_, bytes - done)});
    ++request.blocks_left;
  }
  reap(false);  // frees the slots of blocks already done, then fills the ring
  return ticket;
}

void SwapFile::fill_ring() {
  int prepared = 0;
  while (!queued_.empty() && !free_slots_.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    ENGINE_CHECK(sqe != nullptr, "io_uring submission queue full with free slots");
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    const Block& block = slots_[static_cast<size_t>(slot)] = queued_.front();
    queued_.pop_front();
    if (block.write)
      io_uring_prep_write(sqe, fd_, block.buffer, static_cast<unsigned>(block.bytes),
                          static_cast<uint64_t>(block.offset));
    else
      io_uring_prep_read(sqe, fd_, block.buffer, static_cast<unsigned>(block.bytes),
                         static_cast<uint64_t>(block.offset));
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
    ++prepared;
  }
  if (prepared == 0) return;
  int ret;
  while ((ret = io_uring_submit(ring_.get())) == -EINTR || ret == -EAGAIN) {
  }
  if (ret < 0) throw UserError("swap file " + path_.string() + ": io_uring_submit: " + system_reason(-ret));
}

void SwapFile::reap(bool block) {
  io_uring_cqe* cqe = nullptr;
  if (block) {
    ENGINE_CHECK(in_flight() > 0, "waiting for a swap completion with nothing in flight");
    int ret;
    while ((ret = io_uring_wait_cqe(ring_.get(), &cqe)) == -EINTR) {
    }
    if (ret < 0) throw UserError("swap file " + path_.string() + ": io_uring_wait_cqe: " + system_reason(-ret));
    complete(cqe);
  }
  while (io_uring_peek_cqe(ring_.get(), &cqe) == 0) complete(cqe);
  fill_ring();
}

void SwapFile::complete(io_uring_cqe* cqe) {
  const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(ring_.get(), cqe);
  const Block block = slots_[static_cast<size_t>(slot)];
  free_slots_.push_back(slot);

  if (res == -EINTR || res == -EAGAIN) {
    queued_.push_front(block);  // nothing moved: the same block again
    return;
  }
  const char* verb = block.write ? "write" : "read";
  if (res < 0) {
    finish_block(block, "swap file " + path_.string() + ": " + verb + " of " + std::to_string(block.bytes) +
                            " bytes at offset " + std::to_string(block.offset) + " failed: " + system_reason(-res));
    return;
  }
  (block.write ? bytes_written_ : bytes_read_) += res;
  if (res == 0) {
    finish_block(block, "swap file " + path_.string() + ": short " + verb + " at offset " +
                            std::to_string(block.offset) + ": 0 of " + std::to_string(block.bytes) +
                            " bytes moved (was the file truncated?)");
  } else if (res < block.bytes) {
    // A partial transfer is legal; the rest goes again, first in line.
    queued_.push_front({block.ticket, block.write, block.offset + res, block.buffer + res, block.bytes - res});
  } else {
    finish_block(block, "");
  }
}

void SwapFile::finish_block(const Block& block, const std::string& error) {
  auto it = requests_.find(block.ticket);
  ENGINE_CHECK(it != requests_.end(), "swap completion for unknown ticket " + std::to_string(block.ticket));
  Request& request = it->second;
  --request.blocks_left;
  if (!error.empty() && request.error.empty()) {
    request.error = error;
    // The request has failed: its blocks not yet submitted need not move.
    const auto before = queued_.size();
    std::erase_if(queued_, [&](const Block& b) { return b.ticket == block.ticket; });
    request.blocks_left -= static_cast<int>(before - queued_.size());
  }
  if (request.blocks_left == 0 && request.error.empty()) {
    if (request.submitted_ns >= 0) {  // from submission to the completion seen
      trace::Event event{request.write ? "swap write" : "swap read",
                         "offload",
                         trace::Lane::swap,
                         request.submitted_ns,
                         trace::now_ns(),
                         -1,
                         double(request.bytes),
                         path_.filename().string()};
      trace::record(std::move(event));
    }
    requests_.erase(it);
  }
}

void SwapFile::wait(Ticket ticket) {
  ENGINE_CHECK(ticket > 0 && ticket < next_ticket_,
               "waiting for swap ticket " + std::to_string(ticket) + " that was never issued");
  for (;;) {
    auto it = requests_.find(ticket);
    if (it == requests_.end()) return;
    if (it->second.blocks_left == 0) {
      const std::string error = std::move(it->second.error);
      requests_.erase(it);
      throw UserError(error);
    }
    if (in_flight() == 0) fill_ring();
    reap(true);
  }
}

void SwapFile::wait_all() {
  while (in_flight() > 0 || !queued_.empty()) {
    if (in_flight() == 0) fill_ring();
    reap(true);
  }
  if (requests_.empty()) return;
  // Only failed requests are left; report the earliest.
  auto first = std::min_element(requests_.begin(), requests_.end(),
                                [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::string error = first->second.error;
  requests_.clear();
  throw UserError(error);
}

void SwapFile::check_present() const {
  struct stat open_file {};
  if (::fstat(fd_, &open_file) == 0 && open_file.st_nlink == 0)
    throw UserError("swap file " + path_.string() +
                    " was deleted while in use (was its directory cleaned under "
                    "the running job?)");
  struct stat named {};
  if (::stat(path_.c_str(), &named) != 0)
    throw UserError("swap file " + path_.string() + " is gone while in use: " + system_reason(errno));
  if (named.st_dev != device_ || named.st_ino != inode_)
    throw UserError("swap file " + path_.string() + " was replaced by another file while in use");
}

}  // namespace engine
