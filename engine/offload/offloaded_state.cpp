#include "offload/offloaded_state.h"

#include <algorithm>

#include "core/error.h"

namespace engine {

OffloadedState::OffloadedState(const OffloadSpec& spec, std::vector<int64_t> ranges, std::vector<std::string> kinds,
                               DType param_dtype, bool param_shard)
    : spec_(spec), ranges_(std::move(ranges)), kinds_(std::move(kinds)), param_dtype_(param_dtype) {
  for (int64_t r : ranges_) {
    base_.push_back(elements_);
    elements_ += r;
  }
  const int64_t c = spec_.chunk_size;
  ENGINE_CHECK(c > 0 && c % 2048 == 0, "chunks are whole 4 KiB blocks of 16-bit values");
  chunks_ = chunk_count(elements_, c);
  if (!kinds_.empty())
    optimizer_ =
        std::make_unique<ChunkStore>(spec_.optimizer, swap_spec("optimizer"), c * 4 * int64_t(kinds_.size()), chunks_);
  if (param_shard)
    params_ = std::make_unique<ChunkStore>(spec_.parameters, swap_spec("parameters"), param_bytes(c), chunks_);
}

SwapSpec OffloadedState::swap_spec(const std::string& what) const {
  SwapSpec s;
  s.path = spec_.directory / (spec_.file_stem + "." + what + ".swap");
  s.queue_depth = spec_.queue_depth;
  s.block_size = spec_.block_size;
  return s;
}

bool OffloadedState::has(const std::string& name) const {
  return std::find(kinds_.begin(), kinds_.end(), name) != kinds_.end();
}

size_t OffloadedState::kind(const std::string& name) const {
  auto it = std::find(kinds_.begin(), kinds_.end(), name);
  ENGINE_CHECK(it != kinds_.end(), "the offloaded state holds no " + name);
  return size_t(it - kinds_.begin());
}

void OffloadedState::for_each_run(size_t kind, size_t unit, int64_t first, int64_t count,
                                  const std::function<void(int64_t offset, int64_t bytes)>& fn) const {
  const int64_t c = spec_.chunk_size, k = int64_t(kinds_.size());
  for (int64_t e = base_[unit] + first, end = e + count; e < end;) {
    const int64_t chunk = e / c, n = std::min(end, (chunk + 1) * c) - e;
    fn(((chunk * k + int64_t(kind)) * c + e % c) * 4, n * 4);
    e += n;
  }
}

void OffloadedState::read(size_t kind, size_t unit, int64_t first, int64_t count, float* out) {
  auto* to = reinterpret_cast<std::byte*>(out);
  for_each_run(kind, unit, first, count, [&](int64_t offset, int64_t bytes) {
    optimizer_->read(offset, bytes, to);
    to += bytes;
  });
}

void OffloadedState::write(size_t kind, size_t unit, int64_t first, int64_t count, const float* in) {
  const auto* from = reinterpret_cast<const std::byte*>(in);
  for_each_run(kind, unit, first, count, [&](int64_t offset, int64_t bytes) {
    optimizer_->write(offset, bytes, from);
    from += bytes;
  });
}

void OffloadedState::update(const std::function<void(const Chunk&)>& fn, bool write_back) {
  const int64_t c = spec_.chunk_size;
  optimizer_->stream(
      [&](int64_t index, std::byte* data) {
        Chunk chunk{index, index * c, std::min(c, elements_ - index * c), {}};
        for (size_t k = 0; k < kinds_.size(); ++k)
          chunk.kinds.push_back(reinterpret_cast<float*>(data) + int64_t(k) * c);
        fn(chunk);
        ++chunks_updated_;
      },
      write_back);
}

void OffloadedState::for_each_chunk(const std::function<void(const Chunk&)>& fn) {
  const int64_t c = spec_.chunk_size;
  for (int64_t index = 0; index < chunks_; ++index) fn(Chunk{index, index * c, std::min(c, elements_ - index * c), {}});
}

std::vector<const SwapFile*> OffloadedState::swap_files() const {
  std::vector<const SwapFile*> files;
  for (const auto* store : {optimizer_.get(), params_.get()})
    if (store && store->swap()) files.push_back(store->swap());
  return files;
}

void OffloadedState::check_present() const {
  for (const SwapFile* f : swap_files()) f->check_present();
}

int64_t OffloadedState::bytes_read() const {
  int64_t n = 0;
  for (const SwapFile* f : swap_files()) n += f->bytes_read();
  return n;
}

double OffloadedState::wait_seconds() const {
  double s = 0;
  for (const auto* store : {optimizer_.get(), params_.get()})
    if (store) s += store->wait_seconds();
  return s;
}

int64_t OffloadedState::bytes_written() const {
  int64_t n = 0;
  for (const SwapFile* f : swap_files()) n += f->bytes_written();
  return n;
}

}  // namespace engine
