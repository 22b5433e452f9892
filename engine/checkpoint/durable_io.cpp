#include "checkpoint/durable_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

namespace engine {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw CheckpointIoError(path.string() + ": " + what + ": " + std::strerror(error));
}

struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_durably(const fs::path& path, const void* data, size_t size) {
  DurableWriter file(path);
  file.append(data, size);
  file.finish();
}

DurableWriter::DurableWriter(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", path, errno);
  hash_ = XXH3_createState();
  XXH3_64bits_reset(hash_);
}

DurableWriter::~DurableWriter() {
  if (fd_ >= 0) ::close(fd_);
  XXH3_freeState(hash_);
}

void DurableWriter::append(const void* data, size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  XXH3_64bits_update(hash_, bytes, size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, std::min<size_t>(size - done, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_, errno);
    }
    done += size_t(n);
  }
  bytes_ += int64_t(size);
}

uint64_t DurableWriter::finish() {
  if (::fsync(fd_) != 0) fail("cannot flush to disk", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close", path_, errno);
  return XXH3_64bits_digest(hash_);
}

void sync_directory(const fs::path& dir) {
  Descriptor d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) fail("cannot open the directory", dir, errno);
  if (::fsync(d.fd) != 0) fail("cannot flush the directory", dir, errno);
}

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

std::string checksum_hex(uint64_t sum) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(sum));
  return text;
}

uint64_t read_file_chunks(const fs::path& path, const std::function<void(const std::byte*, size_t, int64_t)>& chunk) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) fail("cannot open", path, errno);
  ::posix_fadvise(file.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(state.get());
  // Double-buffered: the next chunk is read while this one is hashed and handed on.
  constexpr size_t kChunk = size_t(16) << 20;
  std::vector<std::byte> buffers[2] = {std::vector<std::byte>(kChunk), std::vector<std::byte>(kChunk)};
  auto read_at = [&](std::vector<std::byte>& buffer, int64_t offset) -> int64_t {
    size_t done = 0;
    while (done < buffer.size()) {
      const ssize_t n = ::pread(file.fd, buffer.data() + done, buffer.size() - done, offset + int64_t(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return -int64_t(errno);
      if (n == 0) break;
      done += size_t(n);
    }
    return int64_t(done);
  };
  int64_t offset = 0;
  std::future<int64_t> next = std::async(std::launch::async, read_at, std::ref(buffers[0]), 0);
  for (int current = 0;; current ^= 1) {
    const int64_t n = next.get();
    if (n < 0) fail("cannot read", path, int(-n));
    if (n == 0) break;
    if (size_t(n) == kChunk) next = std::async(std::launch::async, read_at, std::ref(buffers[current ^ 1]), offset + n);
    XXH3_64bits_update(state.get(), buffers[current].data(), size_t(n));
    chunk(buffers[current].data(), size_t(n), offset);
    offset += n;
    if (size_t(n) < kChunk) break;
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace engine
