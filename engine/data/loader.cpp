#include "data/loader.h"

namespace engine {

BatchLoader::BatchLoader(const Dataset& dataset, int64_t batch, int64_t sequence, int64_t prefetch, int64_t first_index,
                         int64_t stride)
    : dataset_(dataset),
      batch_(batch),
      sequence_(sequence),
      prefetch_(prefetch),
      next_index_(first_index),
      stride_(stride) {
  if (prefetch_ > 0) worker_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchLoader::produce() {
  int64_t index = next_index_;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || int64_t(ready_.size()) < prefetch_; });
      if (stopping_) return;
    }
    Batch batch(batch_, sequence_, dataset_.features());
    try {
      dataset_.fill(Split::train, index, batch);
      index += stride_;
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    std::lock_guard lock(mutex_);
    ready_.push_back(std::move(batch));
    changed_.notify_all();
  }
}

Batch BatchLoader::next() {
  if (prefetch_ == 0) {
    Batch batch(batch_, sequence_, dataset_.features());
    dataset_.fill(Split::train, next_index_, batch);
    next_index_ += stride_;
    return batch;
  }
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  changed_.notify_all();
  return batch;
}

}  // namespace engine
