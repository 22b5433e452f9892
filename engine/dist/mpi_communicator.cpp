// The MPI communicator (see mpi_communicator.h): a FIFO of operations run by one communication
// thread over point-to-point messages, with the liveness probe that names missing peers.
#include "dist/mpi_communicator.h"

// The C API only: the deprecated C++ bindings bring nothing and warn.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace engine {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

constexpr int kProbeTag = 1;  // control: "I am stuck in operation N"
constexpr int kReplyTag = 2;  // control: "I have reached operation N"
// MPI counts are int: larger buffers travel in pieces of this size, matched in order.
constexpr int64_t kPieceBytes = int64_t{1} << 30;
constexpr microseconds kFirstSleep{20};
constexpr microseconds kLongestSleep{1000};

// The caller's side of one operation: the communication thread finishes it, wait() blocks on it.
class OpState final : public Work::State {
 public:
  void wait() override {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) throw CommunicationError(error_);
  }
  bool done() override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void finish(std::string error) {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string error_;
};

enum class Kind { reduce_scatter, all_gather, all_reduce, broadcast, barrier, call };

struct Op {
  Kind kind;
  const void* send = nullptr;
  void* recv = nullptr;  // the data of all_reduce and broadcast
  int64_t count = 0;     // elements (reductions) or bytes (all_gather, broadcast)
  DType dtype = DType::f32;
  Reduction reduction = Reduction::overwrite;
  int root = 0;
  std::string what;
  int64_t seq = 0;  // 1, 2, ... in submission order, the same on every rank
  std::shared_ptr<OpState> state;
  std::function<void()> call;  // Kind::call: MPI work run on the communication thread (split)
};

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    text += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return text;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommunicatorOptions& options);
  // A process group: its own duplicates of the data and control communicators, the world rank of
  // each of its ranks, and its name for messages.
  MpiCommunicator(double timeout_seconds, MPI_Comm data, MPI_Comm control, std::vector<int> world_ranks,
                  std::string name);
  ~MpiCommunicator() override;

  std::unique_ptr<Communicator> split(int colour, int key, const std::string& name) override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }

  Work reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction, std::string what,
                      Stream) override {
    ENGINE_CHECK(is_floating(dtype), what + ": reductions take f32, bf16 or f16");
    return submit(Op{Kind::reduce_scatter, send, recv, count, dtype, reduction, 0, std::move(what), 0, nullptr, {}});
  }
  Work all_gather(const void* send, void* recv, int64_t bytes, std::string what, Stream) override {
    return submit(
        Op{Kind::all_gather, send, recv, bytes, DType::u16, Reduction::overwrite, 0, std::move(what), 0, nullptr, {}});
  }
  Work all_reduce(void* data, int64_t count, DType dtype, std::string what, Stream) override {
    ENGINE_CHECK(is_floating(dtype), what + ": reductions take f32, bf16 or f16");
    ENGINE_CHECK(count % size_ == 0, what + ": all_reduce of " + std::to_string(count) +
                                         " elements, not divisible by the " + std::to_string(size_) + " ranks");
    return submit(
        Op{Kind::all_reduce, data, data, count, dtype, Reduction::overwrite, 0, std::move(what), 0, nullptr, {}});
  }
  Work broadcast(void* data, int64_t bytes, int root, std::string what, Stream) override {
    ENGINE_CHECK(root >= 0 && root < size_, what + ": broadcast root " + std::to_string(root) + " out of range");
    return submit(Op{
        Kind::broadcast, data, data, bytes, DType::u16, Reduction::overwrite, root, std::move(what), 0, nullptr, {}});
  }
  Work barrier(std::string what) override {
    return submit(
        Op{Kind::barrier, nullptr, nullptr, 0, DType::u16, Reduction::overwrite, 0, std::move(what), 0, nullptr, {}});
  }

  int64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }

  [[noreturn]] void abort_job(int exit_code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    // The launcher forwards output through pipes it stops reading once it kills the job: give it a
    // moment to pass on the message that says why.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the letter of [[noreturn]]
  }

 private:
  Work submit(Op op);
  void run();                         // the communication thread
  std::string execute(const Op& op);  // "" or the error message
  // The phases operations are made of; each returns false when `deadline` passes first.
  bool reduce_scatter_phase(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction, int tag,
                            Clock::time_point deadline);
  bool all_gather_phase(const void* send, void* recv, int64_t bytes, int tag, Clock::time_point deadline);
  bool broadcast_phase(void* data, int64_t bytes, int root, int tag, Clock::time_point deadline);
  void post_send(const void* data, int64_t bytes, int peer, int tag);
  void post_recv(void* data, int64_t bytes, int peer, int tag);
  bool complete(Clock::time_point deadline);  // polls requests_; false on timeout
  void answer_probes();                       // replies to peers asking where this rank is
  std::string diagnose(const Op& op);         // names the peers that did not reach op

  void start();                      // ranks and the communication thread, once data_ and control_ are set
  std::string peer(int rank) const;  // "rank 3" (its world rank)

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_seconds_;
  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::vector<int> world_ranks_;      // per rank of this communicator, its rank in MPI_COMM_WORLD
  std::string name_;                  // "" for the world, else the group's ("tensor-parallel group")
  MPI_Comm data_ = MPI_COMM_NULL;     // the collectives' messages
  MPI_Comm control_ = MPI_COMM_NULL;  // the liveness probe, apart from data that may be stuck
  std::atomic<int64_t> bytes_sent_{0};

  // Shared between the caller and the communication thread.
  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;
  int64_t submitted_ = 0;
  std::atomic<int64_t> reached_{0};  // the last operation this rank submitted, for probes
  bool stopping_ = false;

  // The communication thread's own.
  std::vector<MPI_Request> requests_;
  std::vector<std::byte> scratch_, reduced_;
  std::string failure_;  // the first failure; every later operation fails with it
  int64_t probe_in_ = 0, probe_out_ = 0;
  MPI_Request probe_request_ = MPI_REQUEST_NULL;
  std::list<std::pair<int64_t, MPI_Request>> replies_;  // in flight; a list keeps the values in place
  std::thread thread_;
};

MpiCommunicator::MpiCommunicator(const CommunicatorOptions& options) : timeout_seconds_(options.timeout_seconds) {
  if (!(timeout_seconds_ > 0)) throw UserError("distributed.timeout must be positive");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    owns_mpi_ = true;
  }
  // Every MPI call after this constructor is on the communication thread (abort_job aside), one at
  // a time, which SERIALIZED allows.
  if (provided < MPI_THREAD_SERIALIZED)
    throw UserError("the MPI library offers thread level " + std::to_string(provided) +
                    "; the engine needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
  thread_level_ = provided;
  MPI_Comm_dup(MPI_COMM_WORLD, &data_);
  MPI_Comm_dup(MPI_COMM_WORLD, &control_);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int r = 0; r < world; ++r) world_ranks_.push_back(r);
  start();
}

MpiCommunicator::MpiCommunicator(double timeout_seconds, MPI_Comm data, MPI_Comm control, std::vector<int> world_ranks,
                                 std::string name)
    : timeout_seconds_(timeout_seconds),
      thread_level_(MPI_THREAD_MULTIPLE),
      world_ranks_(std::move(world_ranks)),
      name_(std::move(name)),
      data_(data),
      control_(control) {
  start();
}

void MpiCommunicator::start() {
  MPI_Comm_rank(data_, &rank_);
  MPI_Comm_size(data_, &size_);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  thread_ = std::thread([this] { run(); });
}

std::string MpiCommunicator::peer(int rank) const { return "rank " + std::to_string(world_ranks_.at(size_t(rank))); }

std::unique_ptr<Communicator> MpiCommunicator::split(int colour, int key, const std::string& name) {
  // Each group runs its own communication thread beside this one's: MPI must take calls from
  // several threads at once.
  if (thread_level_ < MPI_THREAD_MULTIPLE)
    throw UserError("process groups (" + name + ") need an MPI library with MPI_THREAD_MULTIPLE; this one offers " +
                    "thread level " + std::to_string(thread_level_));
  if (colour < 0) throw UserError(name + ": a group's colour is not negative (" + std::to_string(colour) + ")");
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
  std::vector<int> members;
  Op op;
  op.kind = Kind::call;
  op.what = "the split into " + name + "s";
  op.call = [&] {
    MPI_Comm_split(data_, colour, key, &data);
    MPI_Comm_split(control_, colour, key, &control);
    int size = 0, mine = world_ranks_[size_t(rank_)];
    MPI_Comm_size(data, &size);
    members.resize(size_t(size));
    MPI_Allgather(&mine, 1, MPI_INT, members.data(), 1, MPI_INT, data);
  };
  submit(std::move(op)).wait();
  return std::make_unique<MpiCommunicator>(timeout_seconds_, data, control, std::move(members), name);
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
  // After a failure the peers this rank would wait for in MPI_Finalize are the missing ones.
  if (!failure_.empty()) return;
  MPI_Cancel(&probe_request_);
  MPI_Wait(&probe_request_, MPI_STATUS_IGNORE);
  for (auto& [value, request] : replies_) MPI_Wait(&request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&control_);
  MPI_Comm_free(&data_);
  if (owns_mpi_) MPI_Finalize();
}

Work MpiCommunicator::submit(Op op) {
  op.state = std::make_shared<OpState>();
  Work work(op.state);
  {
    std::lock_guard lock(mutex_);
    op.seq = ++submitted_;
    reached_.store(op.seq, std::memory_order_relaxed);
    queue_.push_back(std::move(op));
  }
  queue_cv_.notify_one();
  return work;
}

void MpiCommunicator::run() {
  MPI_Irecv(&probe_in_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kProbeTag, control_, &probe_request_);
  while (true) {
    Op op;
    {
      std::unique_lock lock(mutex_);
      // Idle, the thread still wakes every millisecond to answer a peer's probe.
      if (queue_.empty() && !stopping_) queue_cv_.wait_for(lock, kLongestSleep);
      if (queue_.empty()) {
        if (stopping_) return;
        lock.unlock();
        answer_probes();
        continue;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error = execute(op);
    op.state->finish(std::move(error));
  }
}

std::string MpiCommunicator::execute(const Op& op) {
  std::string where = peer(rank_) + ": " + op.what + " (operation " + std::to_string(op.seq) +
                      (name_.empty() ? "" : " of its " + name_) + ")";
  if (!failure_.empty()) return where + " was not run: the communicator failed before (" + failure_ + ")";
  Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds_));
  // Two tags per operation (all_reduce has two phases); MPI guarantees tags up to 32767.
  int tag = static_cast<int>((op.seq * 2) % 32768);
  bool ok = false;
  switch (op.kind) {
    case Kind::reduce_scatter:
      ok = reduce_scatter_phase(op.send, op.recv, op.count, op.dtype, op.reduction, tag, deadline);
      break;
    case Kind::all_gather:
      ok = all_gather_phase(op.send, op.recv, op.count, tag, deadline);
      break;
    case Kind::all_reduce: {
      // Exactly the two public collectives, so the bits match calling them one after the other.
      int64_t chunk = op.count / size_;
      reduced_.resize(static_cast<size_t>(chunk) * dtype_size(op.dtype));
      ok = reduce_scatter_phase(op.send, reduced_.data(), chunk, op.dtype, Reduction::overwrite, tag, deadline) &&
           all_gather_phase(reduced_.data(), op.recv, static_cast<int64_t>(reduced_.size()), tag + 1, deadline);
      break;
    }
    case Kind::broadcast:
      ok = broadcast_phase(op.recv, op.count, op.root, tag, deadline);
      break;
    case Kind::call:  // collective set-up work (split): MPI's own blocking calls, no deadline
      op.call();
      ok = true;
      break;
    case Kind::barrier:
      requests_.emplace_back();
      MPI_Ibarrier(data_, &requests_.back());
      ok = complete(deadline);
      break;
  }
  if (ok) return "";
  failure_ = where + " did not complete within " + seconds_text(timeout_seconds_) + "; " + diagnose(op);
  return failure_;
}

bool MpiCommunicator::reduce_scatter_phase(const void* send, void* recv, int64_t count, DType dtype,
                                           Reduction reduction, int tag, Clock::time_point deadline) {
  const int64_t chunk_bytes = count * static_cast<int64_t>(dtype_size(dtype));
  const auto* chunks = static_cast<const std::byte*>(send);
  scratch_.resize(static_cast<size_t>(chunk_bytes * size_));  // peer r's chunk at r (own slot unused)
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    post_recv(scratch_.data() + peer * chunk_bytes, chunk_bytes, peer, tag);
    post_send(chunks + peer * chunk_bytes, chunk_bytes, peer, tag);
  }
  if (!complete(deadline)) return false;
  // The sum in rank order, rounded at each step: the same bits on every rank and every backend.
  auto chunk_of = [&](int r) -> const void* {
    return r == rank_ ? chunks + r * chunk_bytes : scratch_.data() + r * chunk_bytes;
  };
  int first = 0;
  if (reduction == Reduction::overwrite) {
    std::memcpy(recv, chunk_of(0), static_cast<size_t>(chunk_bytes));
    first = 1;
  }
  for (int r = first; r < size_; ++r) add_into(recv, chunk_of(r), count, dtype);
  return true;
}

bool MpiCommunicator::all_gather_phase(const void* send, void* recv, int64_t bytes, int tag,
                                       Clock::time_point deadline) {
  auto* slots = static_cast<std::byte*>(recv);
  if (send != slots + rank_ * bytes) std::memmove(slots + rank_ * bytes, send, static_cast<size_t>(bytes));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    post_recv(slots + peer * bytes, bytes, peer, tag);
    post_send(slots + rank_ * bytes, bytes, peer, tag);
  }
  return complete(deadline);
}

bool MpiCommunicator::broadcast_phase(void* data, int64_t bytes, int root, int tag, Clock::time_point deadline) {
  if (rank_ == root) {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != root) post_send(data, bytes, peer, tag);
  } else {
    post_recv(data, bytes, root, tag);
  }
  return complete(deadline);
}

void MpiCommunicator::post_send(const void* data, int64_t bytes, int peer, int tag) {
  const auto* at = static_cast<const std::byte*>(data);
  for (int64_t offset = 0; offset < bytes; offset += kPieceBytes) {
    requests_.emplace_back();
    int piece = static_cast<int>(std::min(kPieceBytes, bytes - offset));
    MPI_Isend(at + offset, piece, MPI_BYTE, peer, tag, data_, &requests_.back());
  }
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
}

void MpiCommunicator::post_recv(void* data, int64_t bytes, int peer, int tag) {
  auto* at = static_cast<std::byte*>(data);
  for (int64_t offset = 0; offset < bytes; offset += kPieceBytes) {
    requests_.emplace_back();
    int piece = static_cast<int>(std::min(kPieceBytes, bytes - offset));
    MPI_Irecv(at + offset, piece, MPI_BYTE, peer, tag, data_, &requests_.back());
  }
}

bool MpiCommunicator::complete(Clock::time_point deadline) {
  microseconds sleep = kFirstSleep;
  while (true) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) {
      requests_.clear();
      return true;
    }
    answer_probes();
    if (Clock::now() >= deadline) return false;  // the requests stay posted: the communicator is done
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
}

void MpiCommunicator::answer_probes() {
  while (true) {
    int arrived = 0;
    MPI_Status status;
    MPI_Test(&probe_request_, &arrived, &status);
    if (!arrived) break;
    replies_.emplace_back(reached_.load(std::memory_order_relaxed), MPI_REQUEST_NULL);
    MPI_Isend(&replies_.back().first, 1, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, control_, &replies_.back().second);
    MPI_Irecv(&probe_in_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kProbeTag, control_, &probe_request_);
  }
  for (auto it = replies_.begin(); it != replies_.end();) {
    int sent = 0;
    MPI_Test(&it->second, &sent, MPI_STATUS_IGNORE);
    it = sent ? replies_.erase(it) : std::next(it);
  }
}

std::string MpiCommunicator::diagnose(const Op& op) {
  // Tell every peer where this rank is stuck and ask where it is. A peer's communication thread
  // answers within a millisecond or two unless its process is stopped, hung in MPI or dead.
  probe_out_ = op.seq;
  std::vector<int64_t> reached(static_cast<size_t>(size_), -1);
  std::vector<MPI_Request> asks(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Irecv(&reached[peer], 1, MPI_INT64_T, peer, kReplyTag, control_, &asks[peer]);
    MPI_Request probe;
    MPI_Isend(&probe_out_, 1, MPI_INT64_T, peer, kProbeTag, control_, &probe);
    MPI_Request_free(&probe);  // probe_out_ lives as long as the communicator
  }
  double grace = std::min(0.05 * timeout_seconds_, 3.0);
  Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
  microseconds sleep = kFirstSleep;
  while (true) {
    int all = 0;
    MPI_Testall(size_, asks.data(), &all, MPI_STATUSES_IGNORE);
    answer_probes();
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
  std::vector<int> silent;  // world ranks
  std::string behind;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (asks[peer] != MPI_REQUEST_NULL) {
      MPI_Cancel(&asks[peer]);  // the answer never came; `reached` must not be written later
      MPI_Wait(&asks[peer], MPI_STATUS_IGNORE);
    }
    if (reached[peer] < 0)
      silent.push_back(world_ranks_[size_t(peer)]);
    else if (reached[peer] < op.seq)
      behind += "; " + this->peer(peer) + " is still at operation " + std::to_string(reached[peer]);
  }
  if (!silent.empty()) return rank_list(silent) + " did not reach it (stopped, hung or dead)" + behind;
  if (!behind.empty()) return behind.substr(2);
  return "every rank reached it, but its messages did not arrive";
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const CommunicatorOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace engine
