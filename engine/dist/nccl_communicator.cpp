// The NCCL communicator (dist/nccl_communicator.h): host code over NCCL's and CUDA's runtime APIs;
// the rank-order sum is optim/device_update.h's accumulate_gradients kernel.
#include "dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "optim/device_update.h"

namespace engine {
namespace {

void check_cuda_call(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw CommunicationError("NCCL communicator: " + what + ": " + cudaGetErrorString(status));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    default:
      break;
  }
  ENGINE_CHECK(false, "reductions are defined for f32, bf16 and f16, not " + std::string(dtype_name(dtype)));
  return ncclFloat32;
}

// What the communicator and its operations in flight share, so that waiting on a Work is safe
// whatever outlives what: the NCCL communicator (null once aborted), this rank and the timeout.
struct NcclShared {
  ncclComm_t comm = nullptr;
  int rank = 0;
  double timeout_seconds = 300;

  void abort() {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  // Aborts, so that no rank stays inside a collective, and throws naming this rank.
  [[noreturn]] void fail(const std::string& message) {
    abort();
    throw CommunicationError("rank " + std::to_string(rank) + ": " + message);
  }
  // Calls `ready` (which fails on an error) every 50 us until it says yes; past the timeout, fails:
  // `what` did not `happen` within it.
  template <class Ready>
  void poll(const std::string& what, const char* happen, Ready ready) {
    const auto began = std::chrono::steady_clock::now();
    while (!ready()) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      if (waited > timeout_seconds)
        fail(what + " did not " + happen + " within " + std::to_string(int(timeout_seconds)) +
             " s (distributed.timeout): a peer did not reach it");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // The communicator is non-blocking (config.blocking = 0): initialisation, a group's end and a
  // collective return ncclInProgress while NCCL still connects or enqueues in the background, which
  // a stopped peer would otherwise keep this host inside forever. Polls the communicator's state
  // until that work is done (enqueued on the stream, not complete), within the timeout; fails on
  // an error or past the timeout, naming `what`.
  void settle(const std::string& what) {
    poll(what, "start", [&] {
      if (!comm) fail(what + ": the NCCL communicator was aborted after an earlier failure");
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
      if (queried != ncclSuccess) fail(what + ": NCCL's state: " + ncclGetErrorString(queried));
      if (state != ncclSuccess && state != ncclInProgress) {
        const char* detail = ncclGetLastError(comm);
        fail(what + " failed: " + ncclGetErrorString(state) + " (" + std::string(detail ? detail : "") + ")");
      }
      return state == ncclSuccess;
    });
  }
  // Blocks until `event` is recorded, polling NCCL's asynchronous error; past the timeout, on an
  // NCCL error or on a CUDA error, fails.
  void wait_for(cudaEvent_t event, const std::string& what) {
    poll(what, "complete", [&] {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) {
        cudaGetLastError();
        fail(what + ": " + cudaGetErrorString(status));
      }
      ncclResult_t async = ncclSuccess;
      if (comm && ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        fail(what + " failed: " + ncclGetErrorString(async));
      return false;
    });
  }
};

// An operation in flight: the event its stream records when it is done.
class NcclWork final : public Work::State {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, std::string what) : shared_(std::move(shared)), what_(std::move(what)) {
    check_cuda_call(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), what_);
  }
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override { shared_->wait_for(done_, what_); }
  bool done() override { return cudaEventQuery(done_) == cudaSuccess; }
  void wait_on(Stream stream) override {
    check_cuda_call(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), done_, 0), what_);
  }
  cudaEvent_t event() const { return done_; }

 private:
  std::shared_ptr<NcclShared> shared_;
  std::string what_;
  cudaEvent_t done_ = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, const CommunicatorOptions& options)
      : bootstrap_(bootstrap), device_(device), shared_(std::make_shared<NcclShared>()) {
    shared_->rank = bootstrap.rank();
    shared_->timeout_seconds = options.timeout_seconds;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= device) {
      cudaGetLastError();
      throw UserError("the NCCL communicator needs CUDA device " + std::to_string(device) + " on rank " +
                      std::to_string(bootstrap.rank()) + ", and this machine has " + std::to_string(devices));
    }
    const std::string id = nccl_unique_id(bootstrap);
    ncclUniqueId unique{};
    std::memcpy(&unique, id.data(), sizeof unique);
    check_cuda_call(cudaSetDevice(device), "set device");
    check_cuda_call(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    // Non-blocking, so that a peer that never joins is named within the timeout (settle) rather
    // than leaving this rank inside the initialisation.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t result =
        ncclCommInitRankConfig(&shared_->comm, bootstrap.size(), unique, bootstrap.rank(), &config);
    try {
      if (result != ncclSuccess && result != ncclInProgress)
        shared_->fail(std::string("NCCL initialisation: ") + ncclGetErrorString(result));
      shared_->settle("NCCL initialisation");
    } catch (...) {
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  // Waits (within the timeout) for what is still in flight; a communicator that cannot drain is
  // aborted rather than waited on, so a dead peer never hangs the process here. One already
  // aborted (a failed operation, whose error is on its way up) is not waited on a second time.
  ~NcclCommunicator() override {
    try {
      if (shared_->comm) drain("the NCCL communicator's last operations");
    } catch (const std::exception&) {
    }
    if (shared_->comm) ncclCommDestroy(shared_->comm);
    shared_->comm = nullptr;
    if (staging_) cudaFree(staging_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  int local_rank() const override { return bootstrap_.local_rank(); }
  int local_size() const override { return bootstrap_.local_size(); }
  std::string backend() const override { return "nccl"; }

  Work reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction, std::string what,
                      Stream stream) override {
    const int64_t chunk = count * int64_t(dtype_size(dtype));
    const int world = size();
    const ncclDataType_t type = nccl_type(dtype);  // before the group: nothing may throw inside it
    return start(std::move(what), stream, [&] {
      std::byte* chunks = staging(chunk * world);
      check(ncclGroupStart(), "group");
      // A failed call inside the group is reported after the group's end: the group is always
      // closed before the communicator is aborted.
      ncclResult_t first_error = ncclSuccess;
      const char* failed_call = "";
      const auto note = [&](ncclResult_t result, const char* call) {
        if (first_error == ncclSuccess && result != ncclSuccess && result != ncclInProgress) {
          first_error = result;
          failed_call = call;
        }
      };
      for (int peer = 0; peer < world; ++peer) {
        note(ncclSend(static_cast<const std::byte*>(send) + peer * chunk, size_t(count), type, peer, shared_->comm,
                      stream_),
             "send");
        note(ncclRecv(chunks + peer * chunk, size_t(count), type, peer, shared_->comm, stream_), "receive");
      }
      const ncclResult_t ended = ncclGroupEnd();
      check(first_error, failed_call);
      check(ended, "group");
      // ((chunk_0 + chunk_1) + chunk_2) + ..., or recv + chunk_0 + ... when accumulating.
      int first = 0;
      if (reduction == Reduction::overwrite) {
        check_cuda_call(cudaMemcpyAsync(recv, chunks, size_t(chunk), cudaMemcpyDeviceToDevice, stream_), "copy");
        first = 1;
      }
      for (int peer = first; peer < world; ++peer)
        cuda::accumulate_gradients(recv, chunks + peer * chunk, dtype, count, stream_);
      bytes_sent_ += chunk * (world - 1);
    });
  }

  Work all_gather(const void* send, void* recv, int64_t bytes, std::string what, Stream stream) override {
    return start(std::move(what), stream, [&] {
      check(ncclAllGather(send, recv, size_t(bytes), ncclUint8, shared_->comm, stream_), "all-gather");
      bytes_sent_ += bytes * (size() - 1);
    });
  }

  Work all_reduce(void* data, int64_t count, DType dtype, std::string what, Stream stream) override {
    ENGINE_CHECK(count % size() == 0, "all_reduce needs a count divisible by the world size");
    const int64_t chunk = count / size();
    const int64_t chunk_bytes = chunk * int64_t(dtype_size(dtype));
    auto* mine = static_cast<std::byte*>(data) + rank() * chunk_bytes;
    // The reduce-scatter reads `data` only through its all-to-all, which completes before the sum
    // writes this rank's chunk in place; then every chunk is gathered in place.
    reduce_scatter(data, mine, chunk, dtype, Reduction::overwrite, what, stream);
    return all_gather(mine, data, chunk_bytes, std::move(what), Stream{});
  }

  Work broadcast(void* data, int64_t bytes, int root, std::string what, Stream stream) override {
    return start(std::move(what), stream, [&] {
      check(ncclBroadcast(data, data, size_t(bytes), ncclUint8, root, shared_->comm, stream_), "broadcast");
      if (rank() == root) bytes_sent_ += bytes * (size() - 1);
    });
  }

  Work barrier(std::string what) override {
    drain(what);
    return bootstrap_.barrier(std::move(what));
  }

  int64_t bytes_sent() const override { return bytes_sent_; }

  [[noreturn]] void abort_job(int exit_code) override {
    shared_->abort();
    bootstrap_.abort_job(exit_code);
    std::abort();  // abort_job does not return; the attribute does not travel through the reference
  }

 private:
  // Orders the operation after the caller's stream, enqueues it on the communicator's stream and
  // records its completion.
  template <class Enqueue>
  Work start(std::string what, Stream caller, Enqueue enqueue) {
    if (!shared_->comm)
      throw CommunicationError("rank " + std::to_string(rank()) + ": " + what +
                               ": the NCCL communicator was aborted after an earlier failure");
    check_cuda_call(cudaSetDevice(device_), what);
    if (caller.handle) {
      cudaEvent_t ready = nullptr;
      check_cuda_call(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
      check_cuda_call(cudaEventRecord(ready, static_cast<cudaStream_t>(caller.handle)), what);
      check_cuda_call(cudaStreamWaitEvent(stream_, ready, 0), what);
      cudaEventDestroy(ready);  // released once the wait is done
    }
    auto work = std::make_shared<NcclWork>(shared_, what);
    current_ = what;
    enqueue();
    shared_->settle(what);  // everything enqueued before the event that says it is done
    check_cuda_call(cudaEventRecord(work->event(), stream_), what);
    return Work(work);
  }

  // Everything enqueued so far, done (within the timeout).
  void drain(const std::string& what) {
    cudaEvent_t event = nullptr;
    check_cuda_call(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), what);
    check_cuda_call(cudaEventRecord(event, stream_), what);
    try {
      shared_->wait_for(event, what);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
    cudaEventDestroy(event);
  }

  // The peers' chunks of a reduce-scatter, on the device (grown as needed, never while in use:
  // the stream is drained first).
  std::byte* staging(int64_t bytes) {
    if (bytes > staging_bytes_) {
      drain("reduce staging");
      if (staging_) cudaFree(staging_);
      staging_ = nullptr;
      check_cuda_call(cudaMalloc(&staging_, size_t(bytes)), "reduce staging (" + std::to_string(bytes) + " bytes)");
      staging_bytes_ = bytes;
    }
    return static_cast<std::byte*>(staging_);
  }

  // A call's result: in progress, it is settled (the work enqueued on the stream) before anything
  // else is enqueued there; an error aborts and throws.
  void check(ncclResult_t result, const std::string& what) {
    if (result == ncclInProgress) return shared_->settle(current_ + ": NCCL " + what);
    if (result == ncclSuccess) return;
    const char* detail = ncclGetLastError(shared_->comm);
    shared_->fail(current_ + ": NCCL " + what + ": " + ncclGetErrorString(result) + " (" +
                  std::string(detail ? detail : "") + ")");
  }

  Communicator& bootstrap_;
  int device_;
  std::shared_ptr<NcclShared> shared_;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
  int64_t bytes_sent_ = 0;
  std::string current_ = "NCCL";
};

}  // namespace

std::string nccl_unique_id(Communicator& bootstrap) {
  // Rank 0 broadcasts whatever it has, so that a failure there reaches every rank at once rather
  // than leaving them waiting: an all-zero id says rank 0 could not make one.
  ncclUniqueId id{};
  ncclResult_t made = ncclSuccess;
  if (bootstrap.rank() == 0) made = ncclGetUniqueId(&id);
  if (made != ncclSuccess) id = ncclUniqueId{};
  bootstrap.broadcast(&id, sizeof id, 0, "broadcast of NCCL's unique id").wait();
  std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
  if (bytes == std::string(sizeof id, '\0'))
    throw CommunicationError(
        "rank " + std::to_string(bootstrap.rank()) + ": NCCL's unique id: " +
        (made != ncclSuccess ? std::string(ncclGetErrorString(made)) : std::string("rank 0 could not make one")));
  return bytes;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(bootstrap, device, options);
}

}  // namespace engine
