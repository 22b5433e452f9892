#include "offload/chunk_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace engine {

ChunkStore::ChunkStore(OffloadTier tier, SwapSpec swap, int64_t chunk_bytes, int64_t chunks)
    : chunk_bytes_(chunk_bytes), chunks_(chunks) {
  ENGINE_CHECK(chunk_bytes % kSwapAlignment == 0, "a chunk is a whole number of 4 KiB blocks");
  ENGINE_CHECK(tier != OffloadTier::none, "a chunk store lives in host memory or a swap file");
  if (tier == OffloadTier::cpu) {
    memory_ = Buffer(bytes(), kSwapAlignment);
    return;
  }
  swap.bytes = bytes();
  swap_ = std::make_unique<SwapFile>(swap);
}

ChunkStore::Span ChunkStore::aligned(int64_t offset, int64_t bytes) {
  return {offset / kSwapAlignment * kSwapAlignment, round_up_to_alignment(offset + bytes)};
}

void ChunkStore::check_range(int64_t offset, int64_t bytes) const {
  ENGINE_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= this->bytes(), "a range outside the chunk store");
}

void ChunkStore::wait_for(SwapFile::Ticket ticket) {
  const auto start = std::chrono::steady_clock::now();
  swap_->wait(ticket);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ChunkStore::stream(const std::function<void(int64_t, std::byte*)>& fn, bool write_back) {
  if (!swap_) {
    for (int64_t c = 0; c < chunks_; ++c) fn(c, memory_.data() + c * chunk_bytes_);
    return;
  }
  swap_->check_present();
  for (Buffer& slot : slots_)
    if (slot.bytes() < chunk_bytes_) slot = Buffer(chunk_bytes_, kSwapAlignment);
  auto start_read = [&](int64_t c) {
    const int s = int(c % kChunkSlots);
    if (slot_busy_[s]) wait_for(slot_ticket_[s]);  // its write-back, two chunks ago
    slot_ticket_[s] = swap_->read(c * chunk_bytes_, slots_[s].data(), chunk_bytes_);
    slot_busy_[s] = true;
  };
  try {
    if (chunks_ > 0) start_read(0);
    for (int64_t c = 0; c < chunks_; ++c) {
      const int s = int(c % kChunkSlots);
      wait_for(slot_ticket_[s]);
      slot_busy_[s] = false;
      if (c + 1 < chunks_) start_read(c + 1);
      fn(c, slots_[s].data());
      if (write_back) {
        slot_ticket_[s] = swap_->write(c * chunk_bytes_, slots_[s].data(), chunk_bytes_);
        slot_busy_[s] = true;
      }
    }
    wait();
  } catch (...) {
    // The buffers must not be freed or reused under a transfer in flight.
    try {
      swap_->wait_all();
    } catch (...) {
    }
    std::fill(std::begin(slot_busy_), std::end(slot_busy_), false);
    throw;
  }
}

void ChunkStore::wait() {
  if (!swap_) return;
  for (int s = 0; s < kChunkSlots; ++s)
    if (slot_busy_[s]) {
      slot_busy_[s] = false;
      wait_for(slot_ticket_[s]);
    }
}

void ChunkStore::read(int64_t offset, int64_t bytes, std::byte* out) {
  check_range(offset, bytes);
  if (!swap_) {
    std::memcpy(out, memory_.data() + offset, size_t(bytes));
    return;
  }
  wait();
  if (bounce_.bytes() == 0) bounce_ = Buffer(kBounceBytes, kSwapAlignment);
  while (bytes > 0) {
    const Span span = aligned(offset, std::min(bytes, kBounceBytes - kSwapAlignment));
    swap_->wait(swap_->read(span.begin, bounce_.data(), span.bytes()));
    const int64_t n = std::min(bytes, span.end - offset);
    std::memcpy(out, bounce_.data() + (offset - span.begin), size_t(n));
    out += n;
    offset += n;
    bytes -= n;
  }
}

void ChunkStore::write(int64_t offset, int64_t bytes, const std::byte* in) {
  check_range(offset, bytes);
  if (!swap_) {
    std::memcpy(memory_.data() + offset, in, size_t(bytes));
    return;
  }
  wait();
  if (bounce_.bytes() == 0) bounce_ = Buffer(kBounceBytes, kSwapAlignment);
  while (bytes > 0) {
    const Span span = aligned(offset, std::min(bytes, kBounceBytes - kSwapAlignment));
    const int64_t n = std::min(bytes, span.end - offset);
    // Only the ends of the span can hold bytes outside the range: read them before patching.
    if (offset != span.begin || offset + n != span.end)
      swap_->wait(swap_->read(span.begin, bounce_.data(), span.bytes()));
    std::memcpy(bounce_.data() + (offset - span.begin), in, size_t(n));
    swap_->wait(swap_->write(span.begin, bounce_.data(), span.bytes()));
    in += n;
    offset += n;
    bytes -= n;
  }
}

std::byte* ChunkStore::put(int64_t chunk) {
  ENGINE_CHECK(chunk >= 0 && chunk < chunks_, "a chunk outside the store");
  if (!swap_) return memory_.data() + chunk * chunk_bytes_;
  const int s = int(chunk % kChunkSlots);
  if (slots_[s].bytes() < chunk_bytes_) slots_[s] = Buffer(chunk_bytes_, kSwapAlignment);
  if (slot_busy_[s]) {
    slot_busy_[s] = false;
    wait_for(slot_ticket_[s]);
  }
  return slots_[s].data();
}

void ChunkStore::commit(int64_t chunk) {
  if (!swap_) return;
  const int s = int(chunk % kChunkSlots);
  slot_ticket_[s] = swap_->write(chunk * chunk_bytes_, slots_[s].data(), chunk_bytes_);
  slot_busy_[s] = true;
}

void ChunkStore::reserve_fetch_slots(int slots, int64_t largest) {
  fetches_.resize(size_t(slots));
  if (!swap_) return;
  for (Fetch& f : fetches_) f.buffer = Buffer(fetch_slot_bytes(largest), kSwapAlignment);
}

void ChunkStore::fetch(int slot, int64_t offset, int64_t bytes) {
  check_range(offset, bytes);
  fetched_bytes_ += bytes;
  Fetch& f = fetches_.at(size_t(slot));
  if (!swap_) {
    f.host = memory_.data() + offset;
    return;
  }
  if (f.pending) swap_->wait(f.ticket);
  const Span span = aligned(offset, bytes);
  ENGINE_CHECK(span.bytes() <= f.buffer.bytes(), "a fetch larger than its slot");
  f.ticket = swap_->read(span.begin, f.buffer.data(), span.bytes());
  f.skip = offset - span.begin;
  f.pending = true;
}

const std::byte* ChunkStore::view(int slot) {
  Fetch& f = fetches_.at(size_t(slot));
  if (!swap_) return f.host;
  if (f.pending) {
    f.pending = false;
    wait_for(f.ticket);
  }
  return f.buffer.data() + f.skip;
}

}  // namespace engine
