#include "checkpoint/durable_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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
  Descriptor file{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (file.fd < 0) fail("cannot create", path, errno);
  const auto* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(file.fd, bytes + done, std::min<size_t>(size - done, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    done += size_t(n);
  }
  if (::fsync(file.fd) != 0) fail("cannot flush to disk", path, errno);
  const int fd = file.fd;
  file.fd = -1;
  if (::close(fd) != 0) fail("cannot close", path, errno);
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
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<std::byte> buffer(size_t(16) << 20);
  int64_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(file.fd, buffer.data(), buffer.size(), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", path, errno);
    }
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buffer.data(), size_t(n));
    chunk(buffer.data(), size_t(n), offset);
    offset += n;
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace engine
