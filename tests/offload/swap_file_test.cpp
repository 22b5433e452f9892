// SwapFile: random data through io_uring and back at several queue depths and block sizes, with many
// tickets outstanding and waited for out of order; the exact counters; the preallocated file and its
// removal; and every user error naming the file (missing directory, a full tmpfs, a deleted or
// replaced file, a truncated file, io_uring blocked by seccomp), plus a file system without O_DIRECT.
#include "offload/swap_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "temp_dir.h"

namespace engine {
namespace {

using engine::testing::TempDir;
namespace fs = std::filesystem;
constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

// A file system of `type` mounted on a fresh directory for the test's lifetime; mounted() is false
// where this process may not mount (no CAP_SYS_ADMIN), and the test skips.
class Mount {
 public:
  Mount(const char* type, const char* options, unsigned long flags = 0) : dir_(type) {
    mounted_ = ::mount(type, dir_.path().c_str(), type, flags, options) == 0;
    if (!mounted_) reason_ = std::string("mount -t ") + type + ": " + std::strerror(errno);
  }
  ~Mount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const fs::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string reason_;
};

Buffer random_buffer(int64_t bytes, std::mt19937_64& rng) {
  Buffer buffer(bytes, kSwapAlignment);
  for (int64_t i = 0; i < bytes / 8; ++i) reinterpret_cast<uint64_t*>(buffer.data())[i] = rng();
  return buffer;
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
}

// Waits for `tickets` in a shuffled order.
void wait_shuffled(SwapFile& swap, std::vector<SwapFile::Ticket> tickets, std::mt19937_64& rng) {
  std::shuffle(tickets.begin(), tickets.end(), rng);
  for (SwapFile::Ticket t : tickets) swap.wait(t);
}

// Writes and reads regions of a file, many requests outstanding at once, and checks every byte.
void round_trip(const fs::path& dir, int queue_depth, int64_t block_size) {
  std::mt19937_64 rng(queue_depth * 1000003 + block_size);
  // Disjoint regions of random sizes (multiples of 4 KiB, most not multiples of the block size).
  std::vector<std::pair<int64_t, int64_t>> regions;  // offset, bytes
  int64_t end = 0;
  for (int i = 0; i < 24; ++i) {
    const int64_t bytes = kSwapAlignment * static_cast<int64_t>(1 + rng() % 700);
    regions.push_back({end, bytes});
    end += bytes;
  }
  SwapFile swap({.path = dir / "round-trip.swap", .bytes = end, .queue_depth = queue_depth, .block_size = block_size});
  std::vector<Buffer> expected;
  for (const auto& [offset, bytes] : regions) expected.push_back(random_buffer(bytes, rng));
  int64_t written = 0, read = 0;

  // Every region written at once, waited for out of order.
  std::vector<SwapFile::Ticket> tickets;
  for (size_t i = 0; i < regions.size(); ++i) {
    tickets.push_back(swap.write(regions[i].first, expected[i].data(), regions[i].second));
    written += regions[i].second;
  }
  wait_shuffled(swap, tickets, rng);

  // Reads of the even regions in flight beside new writes to the odd ones.
  std::vector<Buffer> got(regions.size());  // moved into below: a moved-from buffer is empty
  tickets.clear();
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto [offset, bytes] = regions[i];
    if (i % 2 == 0) {
      got[i] = Buffer(bytes, kSwapAlignment);
      tickets.push_back(swap.read(offset, got[i].data(), bytes));
      read += bytes;
    } else {
      expected[i] = random_buffer(bytes, rng);
      tickets.push_back(swap.write(offset, expected[i].data(), bytes));
      written += bytes;
    }
  }
  wait_shuffled(swap, tickets, rng);
  for (size_t i = 0; i < regions.size(); i += 2) EXPECT_TRUE(same_bytes(got[i], expected[i])) << "region " << i;

  // Everything read back in reverse order, collected by wait_all.
  for (size_t i = regions.size(); i-- > 0;) {
    got[i] = Buffer(regions[i].second, kSwapAlignment);
    swap.read(regions[i].first, got[i].data(), regions[i].second);
    read += regions[i].second;
  }
  swap.wait_all();
  for (size_t i = 0; i < regions.size(); ++i) EXPECT_TRUE(same_bytes(got[i], expected[i])) << "region " << i;
  EXPECT_EQ(swap.bytes_written(), written);
  EXPECT_EQ(swap.bytes_read(), read);
}

struct Shape {
  int queue_depth;
  int64_t block_size;
};
class RoundTrip : public ::testing::TestWithParam<Shape> {};

TEST_P(RoundTrip, RandomDataComesBackWithManyTicketsOutstandingAndWaitedOutOfOrder) {
  TempDir dir("swap");
  round_trip(dir.path(), GetParam().queue_depth, GetParam().block_size);
}

INSTANTIATE_TEST_SUITE_P(QueueDepthsAndBlockSizes, RoundTrip,
                         ::testing::Values(Shape{1, 4 * KiB}, Shape{1, MiB}, Shape{32, 4 * KiB}, Shape{32, MiB}),
                         [](const auto& shape) {
                           return "qd" + std::to_string(shape.param.queue_depth) + "_bs" +
                                  std::to_string(shape.param.block_size / KiB) + "k";
                         });

TEST(SwapFile, PreallocatesTheSizeRoundedUpAndRemovesTheFile) {
  TempDir dir("swap");
  const fs::path path = dir / "prealloc.swap";
  {
    SwapFile swap({.path = path, .bytes = 10 * MiB + 1});
    EXPECT_EQ(swap.bytes(), 10 * MiB + kSwapAlignment);
    EXPECT_EQ(swap.path(), path);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 10 * MiB + kSwapAlignment);
    EXPECT_GE(st.st_blocks * 512, 10 * MiB + kSwapAlignment) << "the blocks are reserved, not a sparse file";
    EXPECT_EQ(swap.bytes_read(), 0);
    EXPECT_EQ(swap.bytes_written(), 0);
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(SwapFile, TheDestructorWaitsForRequestsInFlightAndRemovesTheFile) {
  TempDir dir("swap");
  const fs::path path = dir / "busy.swap";
  Buffer data(32 * MiB, kSwapAlignment);
  {
    SwapFile swap({.path = path, .bytes = 32 * MiB, .queue_depth = 4});
    swap.write(0, data.data(), data.bytes());  // never waited for
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(Buffer, IsAlignedZeroFilledAndMovable) {
  Buffer buffer(10000, kSwapAlignment);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kSwapAlignment, 0u);
  EXPECT_EQ(buffer.bytes(), 10000);
  EXPECT_TRUE(std::all_of(buffer.data(), buffer.data() + 3 * kSwapAlignment, [](std::byte b) {
    return b == std::byte{0};
  })) << "zero-filled up to the rounded size";
  buffer.f32()[1] = 2.5f;
  Buffer moved = std::move(buffer);
  EXPECT_EQ(moved.f32()[1], 2.5f);
  EXPECT_EQ(moved.bytes(), 10000);
  EXPECT_EQ(buffer.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is defined
  EXPECT_EQ(buffer.bytes(), 0);
  // The default alignment is a cache line's, and even an empty buffer owns one aligned unit.
  const Buffer small(3), empty(0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % Buffer::kDefaultAlignment, 0u);
  EXPECT_NE(empty.data(), nullptr);
  EXPECT_EQ(empty.bytes(), 0);
}

TEST(SwapFile, ZeroByteAndFinishedTicketsReturnAtOnce) {
  TempDir dir("swap");
  SwapFile swap({.path = dir / "z.swap", .bytes = MiB});
  Buffer data(MiB, kSwapAlignment);
  const SwapFile::Ticket empty = swap.read(0, data.data(), 0);
  swap.wait(empty);
  const SwapFile::Ticket t = swap.write(0, data.data(), MiB);
  swap.wait(t);
  swap.wait(t);
  EXPECT_EQ(swap.bytes_written(), MiB);
}

TEST(SwapFile, MisalignedOrOutOfRangeRequestsAreInternalErrors) {
  TempDir dir("swap");
  SwapFile swap({.path = dir / "a.swap", .bytes = MiB});
  Buffer data(2 * MiB, kSwapAlignment);
  EXPECT_THROW(swap.read(512, data.data(), 4096), InternalError);
  EXPECT_THROW(swap.read(0, data.data(), 4000), InternalError);
  EXPECT_THROW(swap.write(0, data.data() + 512, 4096), InternalError);
  EXPECT_THROW(swap.write(0, data.data(), 2 * MiB), InternalError);
  EXPECT_THROW(swap.wait(99), InternalError);
  EXPECT_THROW(SwapFile({.path = dir / "b.swap", .bytes = MiB, .block_size = 1000}), InternalError);
}

// The message of the UserError `make` throws, or a failure.
template <typename F>
std::string user_error(F make) {
  try {
    make();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

TEST(SwapFileErrors, AMissingDirectoryIsNamed) {
  TempDir dir("swap");
  const fs::path path = dir / "no-such-dir" / "x.swap";
  const std::string message = user_error([&] { SwapFile swap({.path = path, .bytes = MiB}); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;

  std::ofstream(dir / "plain-file") << "x";
  const fs::path under_file = dir / "plain-file" / "x.swap";
  const std::string not_dir = user_error([&] { SwapFile swap({.path = under_file, .bytes = MiB}); });
  EXPECT_NE(not_dir.find(under_file.string()), std::string::npos) << not_dir;
  EXPECT_NE(not_dir.find("is not a directory"), std::string::npos) << not_dir;
}

TEST(SwapFileErrors, AReadOnlyDirectoryIsNamed) {
  Mount readonly("tmpfs", "size=1m", MS_RDONLY);  // root may write anywhere else
  if (!readonly.mounted()) GTEST_SKIP() << "needs a read-only tmpfs: " << readonly.reason();
  const fs::path path = readonly.path() / "x.swap";
  const std::string message = user_error([&] { SwapFile swap({.path = path, .bytes = 4096}); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("directory " + readonly.path().string() + " is not writable"), std::string::npos) << message;
}

TEST(SwapFileErrors, AnExistingFileIsNeitherTruncatedNorRemoved) {
  TempDir dir("swap");
  const fs::path path = dir / "taken.swap";
  std::ofstream(path) << "another run's bytes";
  const std::string message = user_error([&] { SwapFile swap({.path = path, .bytes = MiB}); });
  EXPECT_NE(message.find(path.string() + " already exists"), std::string::npos) << message;
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(fs::file_size(path), 19u);
}

TEST(SwapFileErrors, TooLittleSpaceNamesTheFileAndBothSizes) {
  Mount tmpfs("tmpfs", "size=8m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "needs a small tmpfs: " << tmpfs.reason();
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(tmpfs.path().c_str(), &vfs), 0);
  const auto available = static_cast<int64_t>(vfs.f_bavail * vfs.f_frsize);
  const fs::path path = tmpfs.path() / "big.swap";
  const std::string message = user_error([&] { SwapFile swap({.path = path, .bytes = 16 * MiB}); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("needs 16777216 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(available) + " bytes"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path));
}

TEST(SwapFileErrors, ADeletedFileIsNoticed) {
  TempDir dir("swap");
  const fs::path path = dir / "gone.swap";
  SwapFile swap({.path = path, .bytes = MiB});
  EXPECT_NO_THROW(swap.check_present());
  fs::remove(path);
  const std::string message = user_error([&] { swap.check_present(); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("deleted"), std::string::npos) << message;
}

TEST(SwapFileErrors, AReplacedFileIsNoticedAndNotRemoved) {
  TempDir dir("swap");
  const fs::path path = dir / "replaced.swap";
  {
    SwapFile swap({.path = path, .bytes = MiB});
    fs::create_hard_link(path, dir / "still-linked");  // our inode keeps a name: only the path changed
    std::ofstream(dir / "newcomer") << "someone else's file";
    fs::rename(dir / "newcomer", path);
    const std::string message = user_error([&] { swap.check_present(); });
    EXPECT_NE(message.find(path.string() + " was replaced"), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::exists(path)) << "the destructor removed a file that is not its own";
}

TEST(SwapFileErrors, AShortReadNamesTheFileAndTheOffset) {
  TempDir dir("swap");
  const fs::path path = dir / "short.swap";
  SwapFile swap({.path = path, .bytes = 4 * MiB, .queue_depth = 2, .block_size = MiB});
  ASSERT_EQ(::truncate(path.c_str(), 2 * MiB), 0);  // something shortened the file under the run
  Buffer data(4 * MiB, kSwapAlignment);
  const SwapFile::Ticket t = swap.read(0, data.data(), 4 * MiB);
  const std::string message = user_error([&] { swap.wait(t); });
  EXPECT_NE(message.find("swap file " + path.string() + ": short read at offset "), std::string::npos) << message;
  EXPECT_EQ(swap.bytes_read(), 2 * MiB);
  swap.wait_all();  // the failure was reported once
}

// In a child process: io_uring_setup fails with EPERM, as under a container's default seccomp
// profile; prints the UserError and exits 0.
[[noreturn]] void open_without_io_uring(const fs::path& path) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
    _exit(3);
  try {
    SwapFile swap({.path = path, .bytes = MiB});
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    _exit(0);
  }
  _exit(4);
}

TEST(SwapFileErrors, IoUringBlockedBySeccompIsAClearError) {
  TempDir dir("swap");
  const fs::path path = dir / "seccomp.swap";
  EXPECT_EXIT(open_without_io_uring(path), ::testing::ExitedWithCode(0),
              "swap file .*seccomp\\.swap: io_uring is unavailable \\(io_uring_queue_init: ");
  EXPECT_FALSE(fs::exists(path)) << "the half-made file was left behind";
}

// Opens a file in `dir` with O_DIRECT: whether this kernel's file system there takes it.
bool takes_o_direct(const fs::path& dir) {
  const fs::path probe = dir / "probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  fs::remove(probe);
  return fd >= 0;
}

TEST(SwapFileFileSystems, TmpfsWorks) {
  Mount tmpfs("tmpfs", "size=128m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "needs a tmpfs: " << tmpfs.reason();
  SwapFile swap({.path = tmpfs.path() / "t.swap", .bytes = MiB});
  // Linux 6.6 and later take O_DIRECT on tmpfs; older kernels refuse it.
  EXPECT_EQ(swap.direct(), takes_o_direct(tmpfs.path()));
  round_trip(tmpfs.path(), 4, 64 * KiB);
}

TEST(SwapFileFileSystems, WithoutODirectFilesGoThroughThePageCacheWithOneWarning) {
  Mount ramfs("ramfs", nullptr);  // refuses O_DIRECT and fallocate on every kernel
  if (!ramfs.mounted()) GTEST_SKIP() << "needs a ramfs: " << ramfs.reason();
  std::ostringstream log;
  log::init_logging(0, 1, log::Level::info, std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  {
    SwapFile first({.path = ramfs.path() / "a.swap", .bytes = MiB});
    SwapFile second({.path = ramfs.path() / "b.swap", .bytes = MiB});
    EXPECT_FALSE(first.direct());
    EXPECT_FALSE(second.direct());
    round_trip(ramfs.path(), 8, 128 * KiB);
  }
  log::init_logging(0, 1, log::Level::info);
  const std::string text = log.str();
  const std::string warning = "warning: the file system of " + ramfs.path().string() + " does not support O_DIRECT";
  EXPECT_NE(text.find(warning), std::string::npos) << text;
  EXPECT_EQ(text.find(warning), text.rfind(warning)) << "warned more than once:\n" << text;
  EXPECT_TRUE(fs::is_empty(ramfs.path()));
}

}  // namespace
}  // namespace engine
