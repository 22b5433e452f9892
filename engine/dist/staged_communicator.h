// StagedCommunicator: the Communicator on device buffers, carried out by a host communicator (MPI)
// on page-locked copies of them. Each collective copies its device inputs to the host once the
// caller's stream has produced them, runs the host collective, and copies the results back in the
// caller's stream order; it returns complete (Work::wait_on has nothing left to order).
//
// What it is for: NCCL refuses two ranks on one GPU, so ranks that share a GPU reduce their device
// gradients through it; a GPU run at world > 1 then takes the same path through the device
// optimizer (optim/device_optimizer.h) as one that speaks NCCL, with the host's arithmetic (the
// host communicator's rank-order sums, which NCCL's path repeats on the device: the same bits).
// It does not overlap anything: the host waits for the caller's stream at every collective.
//
//   auto host = make_communicator(options);                                   // the ranks, over MPI
//   auto staged = make_staged_communicator(*host, make_cuda_copies(device));
//   staged->reduce_scatter(grads, shard, count, DType::bf16, Reduction::accumulate, "...", Stream{s});
//
// DeviceCopies is how it reaches the device: CUDA's copies on a stream (make_cuda_copies), or plain
// host memory standing for the device (make_host_copies: the tests of its logic on CPU machines).
#pragma once

#include <cstdint>
#include <memory>

#include "dist/communicator.h"

namespace engine {

class DeviceCopies {
 public:
  virtual ~DeviceCopies() = default;
  // Page-locked host memory where the device has one (else ordinary memory), and its release.
  virtual void* allocate_host(int64_t bytes) = 0;
  virtual void free_host(void* host) = 0;
  // `bytes` from device memory to the host, after `stream`'s work so far; returns once they are there.
  virtual void download(void* host, const void* device, int64_t bytes, Stream stream) = 0;
  // `bytes` from the host to device memory, in `stream`'s order; returns once they are there (the
  // host buffer is free again).
  virtual void upload(void* device, const void* host, int64_t bytes, Stream stream) = 0;
  // Bytes downloaded and uploaded so far (what the tests check the staging by).
  int64_t downloaded = 0, uploaded = 0;
};

// CUDA's copies on CUDA device `device` (a UserError in a build without CUDA).
std::unique_ptr<DeviceCopies> make_cuda_copies(int device);
// "Device" memory that is host memory, copied with memcpy: the staged logic without a device.
std::unique_ptr<DeviceCopies> make_host_copies();

// The staged communicator over `host`'s ranks (which must outlive it); its errors, timeouts and
// hang reports are the host communicator's.
std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, std::shared_ptr<DeviceCopies> copies);

}  // namespace engine
