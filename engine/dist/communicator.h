// Communicator: the collectives that data parallelism and ZeRO speak, and nothing else.
//
// A communicator is a fixed group of ranks (processes); every rank issues the same collectives in
// the same order. Each call starts the operation and returns a Work handle at once; wait() blocks
// until the operation is complete (on this rank), so communication overlaps compute. Buffers must
// stay valid and untouched until then.
//
//   std::unique_ptr<Communicator> comm = make_communicator(CommunicatorOptions{});  // local or MPI
//   Work w = comm->reduce_scatter(grads, shard, shard_elements, DType::f32, Reduction::overwrite,
//                                 "reduce-scatter of unit h.3's gradients");
//   ... more backward ...
//   w.wait();
//
// Reductions are deterministic and the same in every collective: element k of the result is
//   ((send_0[k] + send_1[k]) + send_2[k]) + ...   (rank order, each sum rounded to `dtype`)
// or, with Reduction::accumulate, ((recv[k] + send_0[k]) + send_1[k]) + ...; all_reduce equals
// reduce_scatter followed by all_gather bit for bit. So stage 0's all-reduced gradient, stage 2's
// reduce-scattered shard and world 1's accumulation over the same micro-batches are the same bits.
//
// Buffers are host memory for the local and MPI implementations, which ignore `stream`; device
// memory for NCCL's (dist/nccl_communicator.h), which orders its work after `stream`'s.
//
// Failure: when an operation does not complete within the timeout, wait() throws
// CommunicationError naming this rank, the operation (its `what` label) and the peers that did not
// reach it; a rank that dies makes the launcher end the job.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace engine {

// An opaque device stream (cudaStream_t for NCCL); null for host memory.
struct Stream {
  void* handle = nullptr;
};

class CommunicationError : public UserError {
 public:
  using UserError::UserError;
};

// The handle of an operation in flight. Copyable; waiting twice is harmless.
class Work {
 public:
  struct State {
    virtual ~State() = default;
    virtual void wait() = 0;  // throws CommunicationError
    virtual bool done() = 0;  // true once complete (never throws)
    // Orders `stream`'s later work after the operation; a host operation simply completes.
    virtual void wait_on(Stream /*stream*/) { wait(); }
  };
  Work() = default;  // an already completed operation
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait() {
    if (state_) state_->wait();
  }
  bool done() const { return !state_ || state_->done(); }
  // A device stream's later work waits for the operation, the host does not (NCCL); a host
  // operation is waited for here.
  void wait_on(Stream stream) {
    if (state_) state_->wait_on(stream);
  }

 private:
  std::shared_ptr<State> state_;
};

enum class Reduction { overwrite, accumulate };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this machine and this rank's index among them (threads per rank come from these).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"

  // send: size() * count elements, chunk r for rank r; recv: count elements. send and recv may not
  // overlap. dtype: f32, bf16 or f16. A host implementation receives the peers' chunks into a
  // buffer of size() * count elements that it keeps for the next call (the plan counts it as
  // "reduce staging").
  virtual Work reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction,
                              std::string what, Stream stream = {}) = 0;
  // send: `bytes` bytes from every rank; recv: size() * bytes, rank r's at r * bytes. send may be
  // recv + rank() * bytes (in place).
  virtual Work all_gather(const void* send, void* recv, int64_t bytes, std::string what, Stream stream = {}) = 0;
  // In place over count elements (count divisible by size()); = reduce_scatter + all_gather.
  virtual Work all_reduce(void* data, int64_t count, DType dtype, std::string what, Stream stream = {}) = 0;
  virtual Work broadcast(void* data, int64_t bytes, int root, std::string what, Stream stream = {}) = 0;
  virtual Work barrier(std::string what) = 0;

  // Bytes this rank has sent since it was created (what `engine plan` predicts per step).
  virtual int64_t bytes_sent() const = 0;

  // Process groups (as MPI_Comm_split): a collective every rank of this communicator calls; the
  // ranks that pass the same `colour` form one group, ranked by `key` (then by their rank here).
  // The group is a communicator of its own, with its own collectives, order and timeout, usable
  // beside this one (tensor-, pipeline- and data-parallel groups each run theirs); its errors name
  // the group (`name`, "tensor-parallel group") and the world ranks of the peers.
  virtual std::unique_ptr<Communicator> split(int colour, int key, const std::string& name);

  // Ends the whole job with `exit_code` (every rank, including one that is stopped or hung): what
  // the top level calls after a CommunicationError, since the failed rank cannot finish alone.
  [[noreturn]] virtual void abort_job(int exit_code) = 0;
};

struct CommunicatorOptions {
  double timeout_seconds = 300;  // an operation not complete by then fails with CommunicationError
};

// True when a launcher (mpirun, srun with PMI/PMIx) started this process as one rank of several.
bool launched_by_mpi();

// The local size-1 communicator, or the MPI one when launched_by_mpi(). MPI is initialised only
// then, so a plain `engine train` never touches it.
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options);
std::unique_ptr<Communicator> make_local_communicator();

// Every rank's `values` (the same count on each), rank after rank: rank r's at r * values.size().
std::vector<double> gather_values(Communicator& comm, const std::vector<double>& values, const std::string& what);

// Element-wise `accumulator += addend` rounded to dtype (the step every reduction is made of).
void add_into(void* accumulator, const void* addend, int64_t count, DType dtype);

}  // namespace engine
