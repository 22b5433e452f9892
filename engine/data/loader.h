// BatchLoader: prepares training micro-batches ahead on a background thread.
//
// With prefetch = N it keeps up to N batches ready; with 0 it fills each batch on the caller's
// thread. Either way next() returns batch first, first + stride, first + 2 stride, ... of the train
// split, identical in content (rank r of a world of W reads first = r, stride = W).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "data/dataset.h"

namespace engine {

class BatchLoader {
 public:
  BatchLoader(const Dataset& dataset, int64_t batch, int64_t sequence, int64_t prefetch, int64_t first_index = 0,
              int64_t stride = 1);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch; rethrows an error raised while preparing it.
  Batch next();

 private:
  void produce();

  const Dataset& dataset_;
  int64_t batch_, sequence_, prefetch_, next_index_, stride_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread worker_;
};

}  // namespace engine
