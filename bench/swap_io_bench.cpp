// swap_io_bench: sequential write, then sequential read, of a whole swap file through
// engine::SwapFile, timed; the engine's side of bench/nvme_offload_io.sh (fio is the peer).
//
//   swap_io_bench --dir DIR [--bytes N] [--block-size N] [--queue-depth N] [--request N]
//
// The file is written and read as requests of --request bytes (default 64 MiB) all issued at once,
// so SwapFile keeps --queue-depth blocks of --block-size in flight for the whole pass, as fio does.
// Between the passes the page cache is dropped when this process may (root). Prints one line:
//   swap_io_bench bytes=... block_size=... queue_depth=... direct=1 write_MBps=... read_MBps=...
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "offload/swap_file.h"

namespace {

using engine::Buffer;
using engine::SwapFile;

struct Options {
  std::string dir;
  int64_t bytes = int64_t{2} << 30;
  int64_t block_size = 1 << 20;
  int queue_depth = 8;
  int64_t request = 64 << 20;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw engine::UserError("swap_io_bench: " + arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--dir")
      options.dir = value;
    else if (arg == "--bytes")
      options.bytes = std::stoll(value);
    else if (arg == "--block-size")
      options.block_size = std::stoll(value);
    else if (arg == "--queue-depth")
      options.queue_depth = std::stoi(value);
    else if (arg == "--request")
      options.request = std::stoll(value);
    else
      throw engine::UserError("swap_io_bench: unknown argument " + arg);
  }
  if (options.dir.empty()) throw engine::UserError("swap_io_bench: --dir is required");
  if (options.bytes % options.request != 0)
    throw engine::UserError("swap_io_bench: --bytes must be a multiple of --request");
  return options;
}

// Issues the whole file as requests from one buffer and waits for all; returns seconds.
double pass(SwapFile& swap, bool write, Buffer& buffer, int64_t bytes) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t offset = 0; offset < bytes; offset += buffer.bytes()) {
    if (write)
      swap.write(offset, buffer.data(), buffer.bytes());
    else
      swap.read(offset, buffer.data(), buffer.bytes());
  }
  swap.wait_all();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void drop_caches() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3\n";  // fails quietly without root
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    SwapFile swap({.path = std::filesystem::path(options.dir) / "swap_io_bench.swap",
                   .bytes = options.bytes,
                   .queue_depth = options.queue_depth,
                   .block_size = options.block_size});
    Buffer data(options.request, engine::kSwapAlignment);
    std::mt19937_64 rng(7);
    for (int64_t i = 0; i < options.request / 8; ++i) reinterpret_cast<uint64_t*>(data.data())[i] = rng();
    Buffer back(options.request, engine::kSwapAlignment);

    drop_caches();
    const double write_s = pass(swap, true, data, options.bytes);
    drop_caches();
    const double read_s = pass(swap, false, back, options.bytes);
    if (std::memcmp(data.data(), back.data(), static_cast<size_t>(options.request)) != 0)
      throw std::runtime_error("swap_io_bench: the bytes read back differ from those written");
    if (swap.bytes_written() != options.bytes || swap.bytes_read() != options.bytes)
      throw std::runtime_error("swap_io_bench: the counters disagree with the bytes moved");

    std::printf("swap_io_bench bytes=%lld block_size=%lld queue_depth=%d direct=%d write_MBps=%.1f read_MBps=%.1f\n",
                static_cast<long long>(options.bytes), static_cast<long long>(options.block_size), options.queue_depth,
                swap.direct() ? 1 : 0, options.bytes / write_s / 1e6, options.bytes / read_s / 1e6);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
