// The CUDA device runner (runtime/device_runner.h). Host code: the kernels it calls live in
// ops/<family>/<op>.cu; this file allocates, copies and sequences on one stream.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "cuda_convert.h"
#include "dist/zero_plan.h"
#include "runtime/cuda_check.h"
#include "runtime/device_runner.h"
#include "runtime/executor.h"
#include "runtime/mirror_pool.h"
#include "runtime/planned_casts.h"
#include "runtime/stream_graphs.h"
#include "runtime/value_binding.h"
#include "telemetry/trace.h"

namespace engine {
namespace {

// Bytes allocated per kind, and the device's high-water mark.
struct Tally {
  int64_t device = 0, device_peak = 0, pinned = 0;
};

// One cudaMalloc'd block, zeroed once; counted in the runner's tally while it lives.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  DeviceBlock(int64_t bytes, Tally& tally, const std::string& what) : bytes_(bytes), tally_(&tally) {
    if (bytes <= 0) return;
    const size_t rounded = size_t(arena_aligned(bytes));
    const cudaError_t status = cudaMalloc(&data_, rounded);
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw UserError("the GPU has no room for " + what + " (" + std::to_string(rounded >> 20) + " MiB; " +
                      std::to_string(free >> 20) + " MiB of " + std::to_string(total >> 20) +
                      " MiB free): shrink train.micro_batch_size or turn on activation_checkpointing");
    }
    check_cuda(cudaMemset(data_, 0, rounded), "memset " + what);
    // The runner's streams do not wait for the legacy stream: the zeroes land before anything runs.
    check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "memset " + what);
    tally.device += int64_t(rounded);
    tally.device_peak = std::max(tally.device_peak, tally.device);
    counted_ = int64_t(rounded);
  }
  DeviceBlock(DeviceBlock&& other) noexcept { *this = std::move(other); }
  DeviceBlock& operator=(DeviceBlock&& other) noexcept {
    release();
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(counted_, other.counted_);
    std::swap(tally_, other.tally_);
    return *this;
  }
  ~DeviceBlock() { release(); }
  std::byte* data() const { return static_cast<std::byte*>(data_); }
  int64_t bytes() const { return bytes_; }

 private:
  void release() {
    if (data_) cudaFree(data_);
    if (tally_) tally_->device -= counted_;
    data_ = nullptr;
    bytes_ = counted_ = 0;
  }
  void* data_ = nullptr;
  int64_t bytes_ = 0, counted_ = 0;
  Tally* tally_ = nullptr;
};

// Page-locked host memory (host values the kernels copy to and from).
class PinnedBlock {
 public:
  PinnedBlock(int64_t bytes, Tally& tally) : bytes_(bytes), tally_(&tally) {
    check_cuda(cudaMallocHost(&data_, size_t(std::max<int64_t>(bytes, 1))), "pinned allocation");
    std::memset(data_, 0, size_t(std::max<int64_t>(bytes, 1)));
    tally.pinned += bytes;
  }
  PinnedBlock(const PinnedBlock&) = delete;
  ~PinnedBlock() {
    cudaFreeHost(data_);
    tally_->pinned -= bytes_;
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Tally* tally_;
};

// Page-locked copies of arena buffers for the host's collectives (a run that is not resident):
// MirrorPool (runtime/mirror_pool.h) says which block mirrors a buffer; each block is free for
// reuse once the stream's copy out of it (recorded as an event) is done.
class StagingMirrors {
 public:
  ~StagingMirrors() {
    for (Entry& e : blocks_)
      if (e.copied) cudaEventDestroy(e.copied);
  }
  std::byte* acquire(ValueId buffer, int64_t bytes, Tally& tally) {
    const MirrorPool::Taken taken = pool_.acquire(buffer, bytes);
    if (taken.added) {
      blocks_.push_back(Entry{std::make_unique<PinnedBlock>(bytes, tally)});
      check_cuda(cudaEventCreateWithFlags(&blocks_.back().copied, cudaEventDisableTiming), "event");
    } else {
      check_cuda(cudaEventSynchronize(blocks_[taken.block].copied), "a staging copy");
    }
    return blocks_[taken.block].block->data();
  }
  bool idle() const { return pool_.idle(); }
  std::byte* held(ValueId buffer) const { return blocks_[pool_.held(buffer)].block->data(); }
  // After the last copy out of the buffer's mirror was enqueued on `stream` (or none: null).
  void release(ValueId buffer, cudaStream_t stream) {
    if (stream) check_cuda(cudaEventRecord(blocks_[pool_.held(buffer)].copied, stream), "event record");
    pool_.release(buffer);
  }

 private:
  struct Entry {
    std::unique_ptr<PinnedBlock> block;
    cudaEvent_t copied = nullptr;
  };
  MirrorPool pool_;
  std::vector<Entry> blocks_;  // by MirrorPool's block index
};

class CudaRunner final : public DeviceRunner {
 public:
  CudaRunner(const Graph& graph, ParameterStore& store, int index) : graph_(graph), store_(store), index_(index) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= index) {
      cudaGetLastError();
      throw UserError("run.device: cuda, but no CUDA device is present (" + std::to_string(count) +
                      " found); use run.device: cpu or auto");
    }
    check_cuda(cudaSetDevice(index), "set device");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, index), "device properties");
    name_ = prop.name;
    // First: opening cuBLASLt (ops/linalg/cublaslt_on_demand.cpp) throws a UserError on a machine
    // without it, before anything here needs releasing.
    if (cublasLtCreate(&blas_) != CUBLAS_STATUS_SUCCESS) throw InternalError("cuBLASLt handle");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream");
    check_cuda(cudaStreamCreateWithFlags(&download_stream_, cudaStreamNonBlocking), "download stream");
    check_cuda(cudaEventCreateWithFlags(&inputs_consumed_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&downloaded_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&gradients_written_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&downloads_done_, cudaEventDisableTiming), "event");
    for (cudaEvent_t& copied : staging_copied_)
      check_cuda(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "event");
    step_scalars_ = DeviceBlock(sizeof(StepScalars), tally_, "the step's scalars");
    step_scalars_host_ = std::make_unique<PinnedBlock>(int64_t(sizeof(StepScalars)) * kScalarSlots, tally_);
    for (cudaEvent_t& sent : step_scalars_sent_)
      check_cuda(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), "event");
    workspace_ = DeviceBlock(kDeviceWorkspaceBytes, tally_, "the library workspace");
    const size_t units = graph.units().size();
    // Stage 3 gathers each unit's parameters into the arena, stages 2-3 write the gradients into
    // arena buffers: the device holds what the store holds whole.
    const int stage = store.sharding().stage;
    for (size_t u = 0; u < units; ++u) {
      compute_.emplace_back(stage < 3 ? unit_bytes(u, store.param_dtype()) : 0, tally_, "the parameters");
      grads_.emplace_back(stage < 2 ? unit_bytes(u, store.grad_dtype()) : 0, tally_, "the gradients");
    }
    unit_params_.resize(units);
    for (size_t i = 0; i < graph.params().size(); ++i) unit_params_[size_t(graph.params()[i].unit)].push_back(i);
    for (size_t i = 0; i < graph.values().size(); ++i) {
      const Value& v = graph.values()[i];
      if (v.placement == Placement::input) {
        inputs_.emplace(ValueId(i), DeviceBlock(value_bytes(v), tally_, "the inputs"));
        for (auto& slot : staging_) slot.emplace(ValueId(i), std::make_unique<PinnedBlock>(value_bytes(v), tally_));
      } else if (v.placement == Placement::host)
        host_values_.emplace(ValueId(i), std::make_unique<PinnedBlock>(value_bytes(v), tally_));
    }
  }

  ~CudaRunner() override {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(download_stream_);
    cudaStreamSynchronize(stream_);
    for (auto& [slot, kept] : kept_)
      if (kept.copied) cudaEventDestroy(kept.copied);
    for (cudaEvent_t sent : step_scalars_sent_)
      if (sent) cudaEventDestroy(sent);
    for (void* p : registered_) cudaHostUnregister(p);
    cublasLtDestroy(blas_);
    for (cudaEvent_t copied : staging_copied_) cudaEventDestroy(copied);
    for (cudaEvent_t e : uploaded_) cudaEventDestroy(e);
    cudaEventDestroy(downloaded_);
    cudaEventDestroy(gradients_written_);
    cudaEventDestroy(downloads_done_);
    cudaEventDestroy(inputs_consumed_);
    cudaStreamDestroy(copy_stream_);
    cudaStreamDestroy(download_stream_);
    cudaStreamDestroy(stream_);
  }

  void stage_inputs(const std::map<ValueId, Buffer>& inputs) override {
    check_cuda(cudaSetDevice(index_), "set device");
    // Two staging slots in turn: the host runs ahead of the device, so the last batch's copy out of
    // its slot may still wait for the run before it; a slot is free once the copy out of it two
    // batches ago is done (long since, as a rule).
    const int slot = staging_slot_;
    staging_slot_ = 1 - staging_slot_;
    wait_if_pending(staging_copied_[slot], "the input copy two batches ago");
    for (auto& [id, block] : inputs_)
      std::memcpy(staging_[slot].at(id)->data(), inputs.at(id).data(), size_t(block.bytes()));
    // The device's input blocks are free once the last run's kernels are done with them.
    check_cuda(cudaStreamWaitEvent(copy_stream_, inputs_consumed_, 0), "wait for the last run's inputs");
    for (auto& [id, block] : inputs_)
      check_cuda(cudaMemcpyAsync(block.data(), staging_[slot].at(id)->data(), size_t(block.bytes()),
                                 cudaMemcpyHostToDevice, copy_stream_),
                 "input upload");
    check_cuda(cudaEventRecord(staging_copied_[slot], copy_stream_), "event record");
    staged_ = true;
  }

  void add_plan(const std::string& /*name*/, const Plan& plan) override {
    reset_graphs();  // a captured graph holds the addresses of the blocks this may replace
    if (plan.arena_bytes > arena_.bytes()) arena_ = DeviceBlock(plan.arena_bytes, tally_, "the activations");
    int64_t workspace = kDeviceWorkspaceBytes;
    for (size_t index : plan.nodes) {
      const Node& node = graph_.nodes()[index];
      if (node.op->cuda_workspace) workspace = std::max(workspace, node.op->cuda_workspace(graph_, node));
    }
    workspace = arena_aligned(workspace);  // what a kernel carves from its end starts aligned too
    if (workspace > workspace_.bytes()) workspace_ = DeviceBlock(workspace, tally_, "the kernels' workspace");
    const int64_t scratch = cuda_scratch_bytes(graph_, plan);
    if (scratch > scratch_.bytes()) scratch_ = DeviceBlock(scratch, tally_, "the 16-bit casts' scratch");
  }

  void run(const std::string& name, const Plan& plan, KernelContext ctx, const std::map<ValueId, Buffer>& inputs,
           std::map<std::string, OpTotals>* op_totals, StepCommunication* communication) override {
    const auto began = std::chrono::steady_clock::now();
    check_cuda(cudaSetDevice(index_), "set device");
    // A staged run ends with no buffer held and nothing deferred; one that threw (and was caught)
    // leaves them behind, and they must not leak into this run's collectives.
    ENGINE_CHECK(deferred_.empty() && deferred_units_.empty() && reducing_.empty() && !downloading_ && mirrors_.idle(),
                 "a staged run left collectives behind (an earlier run failed part-way)");
    // A staged run's downloads are done when it returns; one that threw may have left some on their
    // way, which must not overlap this run's zeroing (nothing to wait for otherwise).
    if (!resident_) check_cuda(cudaStreamSynchronize(download_stream_), "an earlier run's gradient downloads");
    // Inputs not staged ahead go first on the copy stream, so that the first node waits for them
    // and not behind every unit's parameter upload.
    if (staged_)
      times_.staged_ahead += 1;
    else
      stage_inputs(inputs);
    staged_ = false;
    if (!resident_ && !parameters_uploaded_) {
      if (upload_parameters()) times_.parameter_uploads += 1;
      parameters_uploaded_ = true;
    }
    // The last staged slot's copy holds this run's inputs.
    check_cuda(cudaStreamWaitEvent(stream_, staging_copied_[1 - staging_slot_], 0), "wait for the inputs");
    write_step_scalars(ctx);
    bind(plan, ctx);
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events;
    // A traced step replays eagerly, each kernel between two events, on the trace's device lane.
    const bool traced = trace::recording();
    cudaEvent_t origin = nullptr;
    int64_t origin_ns = 0;
    if (traced) {
      check_cuda(cudaEventCreate(&origin), "event");
      check_cuda(cudaEventRecord(origin, stream_), "event record");
      origin_ns = trace::now_ns();
    }
    // The device's collectives (NCCL, or staged through the host) are enqueued eagerly between the
    // graphs of the kernels around them: a staged one blocks the host, and a reduction's overwrite
    // or accumulate follows the micro-batch.
    const bool replayed = graphs_.enabled() && resident_ && !op_totals && !traced;
    if (replayed && plan_actions_ && !plan.actions.empty())
      enqueue_segments(name, plan, ctx);
    else if (replayed)
      graphs_.run("plan " + name, stream_, [&] { enqueue_plan(plan, ctx, nullptr, nullptr); });
    else
      enqueue_plan(plan, ctx, op_totals || traced ? &events : nullptr, resident_ ? nullptr : communication);
    check_cuda(cudaEventRecord(inputs_consumed_, stream_), "event record");
    if (plan.training && !resident_) finish_downloads();
    const auto enqueued = std::chrono::steady_clock::now();
    times_.runs += 1;
    times_.enqueue_seconds += std::chrono::duration<double>(enqueued - began).count();
    last_run_[name] = ctx.pointers;
    // A resident run's results stay on the device until a reader waits for them.
    if (resident_ && !op_totals && !traced) return;
    if (plan_actions_) plan_actions_->wait_for_collectives();
    synchronize("step of plan " + name);
    if (traced) trace_events(plan, origin, origin_ns, events);
    if (op_totals) total_events(plan, events, *op_totals);
    destroy_events(events);
    if (resident_) return;  // the device optimizer sums the micro-batches
    // The reductions of the store's gradients (ZeRO 0-1), now that they are on the host.
    for (const StepAction& action : deferred_) communication->run(action, nullptr);
    deferred_.clear();
  }

  // A kept copy read at once, in a slot of its own per value (keep_value's slots are 0 and up).
  const float* value_f32(const std::string& name, const Plan& plan, ValueId id) override {
    const int slot = -1 - int(id);
    keep_value(name, plan, id, slot);
    return kept_f32(slot);
  }

  void keep_value(const std::string& name, const Plan& plan, ValueId id, int slot) override {
    const auto found = last_run_.find(name);
    ENGINE_CHECK(found != last_run_.end(), "plan " + name + " has not run on the device");
    const Value& v = graph_.value(id);
    ENGINE_CHECK(v.placement == Placement::activation && plan.offsets[size_t(id)] >= 0,
                 "value " + v.name + " is not an activation of plan " + name);
    KeptValue& kept = kept_[slot];
    if (!kept.block || kept.block->bytes() != value_bytes(v)) {
      kept.block = std::make_unique<PinnedBlock>(value_bytes(v), tally_);
      if (!kept.copied) check_cuda(cudaEventCreateWithFlags(&kept.copied, cudaEventDisableTiming), "event");
    }
    kept.type = v.dtype;
    kept.count = v.shape.numel();
    check_cuda(cudaMemcpyAsync(kept.block->data(), found->second[size_t(id)], size_t(kept.block->bytes()),
                               cudaMemcpyDeviceToHost, stream_),
               "copy of " + v.name);
    check_cuda(cudaEventRecord(kept.copied, stream_), "event record");
  }

  const float* kept_f32(int slot) override {
    const auto found = kept_.find(slot);
    ENGINE_CHECK(found != kept_.end() && found->second.block, "nothing was kept in slot " + std::to_string(slot));
    KeptValue& kept = found->second;
    wait_if_pending(kept.copied, "a kept value");
    kept.values.resize(size_t(kept.count));
    widen(kept.block->data(), kept.type, kept.values.data(), kept.count);
    return kept.values.data();
  }

  // Where the event lies behind device collectives (a plan with actions), a peer that never reaches
  // one would keep the event from happening and the host blocked here past distributed.timeout,
  // naming nobody. So the host polls the event, and if it has not happened within
  // kCollectivePollSeconds, waits for the collectives in flight through their handles first (which
  // name such a peer within the timeout) before it blocks. A prompt event keeps the host's run-ahead.
  void wait(void* event, const std::string& what) override {
    const auto e = static_cast<cudaEvent_t>(event);
    counted_wait(
        [&] {
          if (plan_actions_ && !happens_within(e, kCollectivePollSeconds, what)) plan_actions_->wait_for_collectives();
          return cudaEventSynchronize(e);
        },
        what);
  }
  static constexpr double kCollectivePollSeconds = 1.0;
  // Whether `event` happens within `seconds`, polled.
  static bool happens_within(cudaEvent_t event, double seconds, const std::string& what) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) check_cuda(status, what);
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  void synchronize(const std::string& what) override {
    counted_wait([&] { return cudaStreamSynchronize(stream_); }, what);
  }
  // One of the host's waits for the device, timed and counted in times().
  template <class Wait>
  void counted_wait(Wait&& block, const std::string& what) {
    const auto began = std::chrono::steady_clock::now();
    check_cuda(block(), what);
    times_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    times_.waits += 1;
  }

  // A wait only where `event` has not happened yet (an earlier copy out of a slot about to be reused).
  void wait_if_pending(cudaEvent_t event, const std::string& what) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady)
      wait(event, what);
    else
      check_cuda(status, what);
  }

  void use_graphs(bool on) override { graphs_.set_enabled(on); }
  void reset_graphs() override { graphs_.reset(); }
  int64_t graph_replays() const override { return graphs_.replays(); }

  DeviceTimes times() const override { return times_; }
  void parameters_changed() override { parameters_uploaded_ = false; }
  void set_resident(bool resident, DevicePlanActions* actions) override {
    resident_ = resident;
    plan_actions_ = resident ? actions : nullptr;
  }
  std::byte* parameters(size_t unit) override { return compute_.at(unit).data(); }
  std::byte* gradients(size_t unit) override { return grads_.at(unit).data(); }
  void* stream() override { return stream_; }
  std::byte* allocate(int64_t bytes, const std::string& what) override {
    extra_.emplace_back(bytes, tally_, what);
    return extra_.back().data();
  }

  DeviceMemory memory() const override {
    DeviceMemory m;
    m.device = tally_.device;
    m.device_peak = tally_.device_peak;
    m.pinned = tally_.pinned;
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      m.device_used = int64_t(total - free);
      m.device_total = int64_t(total);
    }
    m.name = name_;
    return m;
  }

 private:
  int64_t unit_bytes(size_t u, DType type) const { return store_.layout().padded(u) * int64_t(dtype_size(type)); }

  // The store's buffers are registered with the driver the first time they are copied, so every
  // later copy is a DMA at full link speed rather than a staged pageable copy.
  void register_once(void* host, int64_t bytes) {
    if (!host || bytes <= 0 || std::find(registered_.begin(), registered_.end(), host) != registered_.end()) return;
    const cudaError_t status = cudaHostRegister(host, size_t(bytes), cudaHostRegisterDefault);
    if (status == cudaSuccess) {
      registered_.push_back(host);
      return;
    }
    cudaGetLastError();  // a pageable copy still works, only slower: it blocks the host until it is done
    if (!register_failure_said_)
      spdlog::warn(
          "page-locking {} bytes of the model's host state failed ({}): its copies are pageable, and each "
          "blocks the host until it is done",
          bytes, cudaGetErrorString(status));
    register_failure_said_ = true;
  }

  // Each unit's parameters on the copy stream, once the last run's kernels are done reading the
  // device's copy; the plan's first node that reads a unit waits for its upload (wait_for_uploads),
  // so the forward of the first units runs while the later ones are copied.
  bool upload_parameters() {  // whether there was any (ZeRO-3 gathers every unit where it is used)
    if (uploaded_.empty()) {
      uploaded_.resize(compute_.size());
      for (cudaEvent_t& e : uploaded_) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    }
    check_cuda(cudaStreamWaitEvent(copy_stream_, inputs_consumed_, 0), "wait for the last run's parameter reads");
    for (size_t u = 0; u < compute_.size(); ++u) {
      if (!compute_[u].data()) continue;  // ZeRO-3: gathered where the plan uses it
      std::byte* host = store_.compute(u);
      register_once(host, compute_[u].bytes());
      check_cuda(
          cudaMemcpyAsync(compute_[u].data(), host, size_t(compute_[u].bytes()), cudaMemcpyHostToDevice, copy_stream_),
          "parameter upload");
      check_cuda(cudaEventRecord(uploaded_[u], copy_stream_), "event record");
      uploading_.insert(u);
    }
    return !uploading_.empty();
  }
  // The stream waits for the uploads of the units `node` reads (every unit, for node null: the end
  // of the plan, so that waiting for the stream waits for every upload).
  void wait_for_uploads(const Node* node) {
    if (uploading_.empty()) return;
    auto wait_for = [&](size_t u) {
      if (uploading_.erase(u))
        check_cuda(cudaStreamWaitEvent(stream_, uploaded_[u], 0), "wait for a unit's parameters");
    };
    if (!node) {
      while (!uploading_.empty()) wait_for(*uploading_.begin());
      return;
    }
    for (ValueId id : node->inputs)
      if (const Value& v = graph_.value(id); v.placement == Placement::parameter)
        wait_for(size_t(graph_.params()[size_t(v.param)].unit));
  }

  // A staged run's downloads run on a stream of their own, each behind the kernels that wrote its
  // gradients (an event on the compute stream), so the backward goes on while they copy.
  void download(std::byte* host, const std::byte* device, int64_t bytes) {
    check_cuda(cudaEventRecord(gradients_written_, stream_), "event record");
    check_cuda(cudaStreamWaitEvent(download_stream_, gradients_written_, 0), "wait for the gradients");
    check_cuda(cudaMemcpyAsync(host, device, size_t(bytes), cudaMemcpyDeviceToHost, download_stream_),
               "gradient download");
  }
  // The store's micro-batch gradients of unit `u` (ZeRO 0-1; ZeRO-2/3's are reduced from the arena
  // where the plan says), once.
  void download_unit(size_t u) {
    if (!grads_[u].data() || !downloads_pending_.erase(u)) return;
    std::byte* host = store_.micro_grad(u);
    register_once(host, grads_[u].bytes());
    download(host, grads_[u].data(), grads_[u].bytes());
  }
  // A staged training run's downloads start as the backward finishes each unit (ZeRO 0-1: after
  // the last node that writes the unit's gradients, gradient_writes); the units no node wrote go
  // at the end, and the stream waits for them all, so waiting for the stream waits for the host's
  // copies, and the next run's zeroing follows them.
  void start_downloads(const Plan& plan) {
    downloads_pending_.clear();
    finished_at_.assign(plan.nodes.size(), {});
    const std::vector<GradientWrites> writes = gradient_writes(graph_, plan.nodes);
    for (size_t u = 0; u < grads_.size(); ++u) {
      if (!grads_[u].data()) continue;
      downloads_pending_.insert(u);
      if (writes[u].last >= 0) finished_at_[size_t(writes[u].last)].push_back(u);
    }
  }
  void finish_downloads() {
    while (!downloads_pending_.empty()) download_unit(*downloads_pending_.begin());
    check_cuda(cudaEventRecord(downloads_done_, download_stream_), "event record");
    check_cuda(cudaStreamWaitEvent(stream_, downloads_done_, 0), "wait for the gradients' downloads");
  }

  // The plan's work on the stream: the gradients zeroed (training), then each node's kernel, each
  // between two events where `events` is given, and the plan's actions between them: with
  // `communication` on the host (staged: below), else through the device optimizer's
  // (DevicePlanActions: a resident run at ZeRO-2/3 or reducing through a device communicator).
  void enqueue_plan(const Plan& plan, KernelContext& ctx, std::vector<std::pair<cudaEvent_t, cudaEvent_t>>* events,
                    StepCommunication* communication) {
    if (plan.training) zero_gradients();
    const bool downloads = plan.training && !resident_;
    if (downloads) start_downloads(plan);
    for (size_t position = 0; position <= plan.nodes.size(); ++position) {
      if (!plan.actions.empty()) {
        if (communication)
          for (const StepAction& action : plan.actions[position]) run_staged(plan, action, ctx, *communication);
        else if (resident_ && plan_actions_)
          for (const StepAction& action : plan.actions[position]) run_on_device(plan, action, ctx);
      }
      if (position == plan.nodes.size()) {
        if (communication) start_downloaded_reductions(*communication, -1);  // a plan waits for each; none left
        wait_for_uploads(nullptr);
        break;
      }
      const Node& node = graph_.nodes()[plan.nodes[position]];
      wait_for_uploads(&node);
      cudaEvent_t start = nullptr, stop = nullptr;
      if (events) {
        check_cuda(cudaEventCreate(&start), "event");
        check_cuda(cudaEventCreate(&stop), "event");
        check_cuda(cudaEventRecord(start, stream_), "event record");
      }
      run_node(node, ctx);
      if (events) {
        check_cuda(cudaEventRecord(stop, stream_), "event record");
        events->emplace_back(start, stop);
      }
      if (downloads)
        for (size_t u : finished_at_[position]) download_unit(u);
    }
  }

  void zero_gradients() {
    for (DeviceBlock& g : grads_)
      if (g.data()) check_cuda(cudaMemsetAsync(g.data(), 0, size_t(g.bytes()), stream_), "zero gradients");
  }

  // A resident plan whose actions run through the device optimizer (DevicePlanActions): each run of
  // nodes between two positions with actions replays as a CUDA graph of its own (StreamGraphs: eager
  // first, captured second), and the actions run eagerly between them, so the collectives stay
  // outside the graphs while the kernels keep one launch per segment. Segments are numbered in plan
  // order, the same at every run.
  void enqueue_segments(const std::string& name, const Plan& plan, KernelContext& ctx) {
    size_t begin = 0;
    int segment = 0;
    const bool any_gradients = std::any_of(grads_.begin(), grads_.end(), [](const DeviceBlock& g) { return g.data(); });
    auto flush = [&](size_t end) {
      const bool zeroes = segment == 0 && plan.training && any_gradients;
      if (end > begin || zeroes)
        graphs_.run("plan " + name + " segment " + std::to_string(segment), stream_, [&] {
          if (zeroes) zero_gradients();
          for (size_t p = begin; p < end; ++p) run_node(graph_.nodes()[plan.nodes[p]], ctx);
        });
      ++segment;
    };
    for (size_t position = 0; position <= plan.nodes.size(); ++position) {
      if (plan.actions[position].empty()) continue;
      flush(position);
      for (const StepAction& action : plan.actions[position]) run_on_device(plan, action, ctx);
      begin = position;
    }
    flush(plan.nodes.size());
  }

  // One of the plan's actions on a resident run (ZeRO-2/3's, and every stage's reductions through a
  // device communicator), on the device's buffers in stream order:
  // the device optimizer starts the gathers and reductions, and the stream waits for each where the
  // plan uses the parameters or reuses the gradients' buffer; in between it computes.
  void run_on_device(const Plan& plan, const StepAction& action, KernelContext& ctx) {
    using Kind = StepAction::Kind;
    ENGINE_CHECK(action.kind == Kind::wait || action.kind == Kind::reduce || action.buffer != kNoValue,
                 "a resident plan's gather or gradient buffer outside the arena");
    std::byte* device = action.buffer == kNoValue ? nullptr : arena_.data() + plan.offsets[size_t(action.buffer)];
    switch (action.kind) {
      case Kind::gather:
        plan_actions_->gather(action.unit, device);
        break;
      case Kind::use_params:
        plan_actions_->use_params(action.unit, device);
        bind_unit(action.unit, device, false, ctx);
        break;
      case Kind::grads_into:
        check_cuda(cudaMemsetAsync(device, 0, size_t(value_bytes(graph_.value(action.buffer))), stream_),
                   "zero gradient buffer");
        bind_unit(action.unit, device, true, ctx);
        break;
      case Kind::reduce:  // from an arena buffer (ZeRO-2/3), or the unit's own gradients (null: ZeRO 0-1)
        plan_actions_->reduce(action.unit, device);
        break;
      case Kind::wait:
        plan_actions_->wait(action.unit);
        break;
    }
  }

  // One of the plan's actions on a run that is not resident: the communication runs on the host
  // (ZeroStep over the host communicator), on page-locked mirrors of the arena's buffers:
  //   gather      into a mirror; use_params waits for it, copies it into the arena buffer on the
  //               stream and points the unit's parameters there;
  //   grads_into  zeroes the arena buffer on the stream and points the unit's gradients there;
  //   reduce      from an arena buffer: copied into a mirror on the download stream behind the
  //               kernels that wrote it, and reduce-scattered from there once the host reaches the plan's next
  //               reduce or the unit's wait (start_downloaded_reductions), so the host enqueues the
  //               backward in between before it waits for the copy: the device computes the next
  //               units while the host reduces this one. From the store's gradients (ZeRO 0-1):
  //               after the run, once they are downloaded, with the unit's wait.
  void run_staged(const Plan& plan, const StepAction& action, KernelContext& ctx, StepCommunication& comm) {
    using Kind = StepAction::Kind;
    const bool deferred = (action.kind == Kind::reduce && action.buffer == kNoValue) ||
                          (action.kind == Kind::wait && deferred_units_.count(action.unit));
    if (deferred) {
      if (action.kind == Kind::reduce) deferred_units_.insert(action.unit);
      if (action.kind == Kind::wait) deferred_units_.erase(action.unit);
      deferred_.push_back(action);
      return;
    }
    std::byte* device = action.buffer == kNoValue ? nullptr : arena_.data() + plan.offsets[size_t(action.buffer)];
    const int64_t bytes = action.buffer == kNoValue ? 0 : value_bytes(graph_.value(action.buffer));
    switch (action.kind) {
      case Kind::gather:
        comm.run(action, mirrors_.acquire(action.buffer, bytes, tally_));
        break;
      case Kind::use_params: {
        std::byte* mirror = mirrors_.held(action.buffer);
        comm.run(action, mirror);
        check_cuda(cudaMemcpyAsync(device, mirror, size_t(bytes), cudaMemcpyHostToDevice, stream_), "gathered upload");
        mirrors_.release(action.buffer, stream_);
        bind_unit(action.unit, device, false, ctx);
        break;
      }
      case Kind::grads_into:
        check_cuda(cudaMemsetAsync(device, 0, size_t(bytes), stream_), "zero gradient buffer");
        bind_unit(action.unit, device, true, ctx);
        break;
      case Kind::reduce: {
        start_downloaded_reductions(comm, -1);
        std::byte* mirror = mirrors_.acquire(action.buffer, bytes, tally_);
        download(mirror, device, bytes);
        check_cuda(cudaEventRecord(downloaded_, download_stream_), "event record");
        downloading_ = Download{action, mirror};
        break;
      }
      case Kind::wait: {
        start_downloaded_reductions(comm, action.unit);
        comm.run(action, nullptr);
        const auto found = reducing_.find(action.unit);
        if (found != reducing_.end()) {
          mirrors_.release(found->second, nullptr);
          reducing_.erase(found);
        }
        break;
      }
    }
  }

  // The reduce-scatter whose gradients are on their way to the host (at most one: each reduce
  // starts the one before it), started where the plan's next reduce, the unit's wait (`unit`) or
  // the plan's end (-1) comes: the host waits for the copy, then hands the mirror to the host
  // communicator. Where it starts depends only on the plan, so every rank starts its collectives in
  // the same order.
  void start_downloaded_reductions(StepCommunication& comm, int unit) {
    if (!downloading_ || (unit >= 0 && downloading_->action.unit != unit)) return;  // none, or started already
    const Download d = *downloading_;
    downloading_.reset();
    wait(downloaded_, "the gradients of a reduce-scatter");
    comm.run(d.action, d.mirror);
    reducing_[d.action.unit] = d.action.buffer;
  }

  // Points unit `unit`'s parameters (or gradients) at `buffer`, laid out as the store's.
  void bind_unit(int unit, std::byte* buffer, bool gradients, KernelContext& ctx) {
    for (size_t index : unit_params_[size_t(unit)]) {
      const Param& p = graph_.params()[index];
      const ValueId id = gradients ? p.grad : p.value;
      ctx.pointers[size_t(id)] = buffer + p.offset * int64_t(dtype_size(graph_.value(id).dtype));
    }
  }

  // The step's identity into device memory, ahead of the plan's kernels on the stream. A resident
  // run returns before its kernels ran, so the next run's scalars go through another page-locked
  // slot than the copy still waiting on the stream; a slot is rewritten once its last copy is done
  // (kScalarSlots runs ago, as a rule long since).
  void write_step_scalars(KernelContext& ctx) {
    const int index = next_scalar_slot_;
    next_scalar_slot_ = (next_scalar_slot_ + 1) % kScalarSlots;
    wait_if_pending(step_scalars_sent_[index], "an earlier run's step scalars");
    auto* slot = reinterpret_cast<StepScalars*>(step_scalars_host_->data()) + index;
    *slot = StepScalars{.seed = ctx.seed, .step = ctx.step, .micro_step = ctx.micro_step, .loss_scale = ctx.loss_scale};
    check_cuda(cudaMemcpyAsync(step_scalars_.data(), slot, sizeof(StepScalars), cudaMemcpyHostToDevice, stream_),
               "step scalars");
    check_cuda(cudaEventRecord(step_scalars_sent_[index], stream_), "event record");
    ctx.step_scalars = reinterpret_cast<const StepScalars*>(step_scalars_.data());
  }

  // Points every value at its device memory: the same offsets as the host would use.
  void bind(const Plan& plan, KernelContext& ctx) {
    ctx.graph = &graph_;
    ctx.device = Device{Device::Kind::cuda, index_};
    ctx.stream = stream_;
    ctx.blas = blas_;
    ctx.workspace = workspace_.data();
    ctx.workspace_bytes = size_t(workspace_.bytes());
    bind_values(graph_, plan, arena_.data(), ctx, [&](const Value& v, ValueId id) -> void* {
      switch (v.placement) {
        case Placement::parameter:
        case Placement::gradient: {
          const Param& p = graph_.params()[size_t(v.param)];
          const DeviceBlock& block =
              v.placement == Placement::parameter ? compute_[size_t(p.unit)] : grads_[size_t(p.unit)];
          if (!block.data()) return nullptr;  // bound by the plan's actions (ZeRO-2/3)
          return block.data() + p.offset * int64_t(dtype_size(v.dtype));
        }
        case Placement::input:
          return inputs_.at(id).data();
        default:  // host
          return host_values_.at(id)->data();
      }
    });
  }

  // The node's kernel; where it computes in f32 only, on f32 copies of its 16-bit values
  // (runtime/planned_casts.h), converted on the device.
  void run_node(const Node& node, KernelContext& ctx) {
    if (!needs_conversion(graph_, node, Device::Kind::cuda)) return node.op->cuda(node, ctx);
    copies_.run(
        graph_, node, ctx, scratch_.data(), node.op->cuda,
        [&](const void* src, DType type, float* dst, int64_t n) { cuda::widen(src, type, dst, n, stream_); },
        [&](const float* src, void* dst, DType type, int64_t n) { cuda::narrow(src, dst, type, n, stream_); });
  }

  void total_events(const Plan& plan, std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& events,
                    std::map<std::string, OpTotals>& totals) {
    for (size_t i = 0; i < events.size(); ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, events[i].first, events[i].second), "event time");
      const Node& node = graph_.nodes()[plan.nodes[i]];
      const NodeWork work = node_work(graph_, node);
      OpTotals& t = totals[node.op->name];
      t.seconds += ms * 1e-3;
      t.calls += 1;
      t.flops += work.flops;
      t.bytes += work.bytes;
    }
  }

  // Each node's kernels as an event on the trace's device lane, at the host's clock of `origin`
  // (recorded on the idle stream as the replay began) plus the device's time since.
  void trace_events(const Plan& plan, cudaEvent_t origin, int64_t origin_ns,
                    const std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& events) {
    const auto at = [&](cudaEvent_t e) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, origin, e), "event time");
      return origin_ns + int64_t(double(ms) * 1e6);
    };
    for (size_t i = 0; i < events.size(); ++i) {
      const Node& node = graph_.nodes()[plan.nodes[i]];
      const NodeWork work = node_work(graph_, node);
      trace::Event event{.name = node.op->name,
                         .category = "op",
                         .lane = trace::Lane::device,
                         .start_ns = at(events[i].first),
                         .end_ns = at(events[i].second),
                         .flops = work.flops,
                         .bytes = work.bytes,
                         .detail = node.name};
      trace::record(std::move(event));
    }
    cudaEventDestroy(origin);
  }

  static void destroy_events(std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& events) {
    for (auto& [start, stop] : events) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
    events.clear();
  }

  const Graph& graph_;
  ParameterStore& store_;
  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  // Inputs travel on their own stream (stage_inputs), between two events: the last run is done
  // reading the device's input blocks, and the next inputs are in them.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t inputs_consumed_ = nullptr;
  bool staged_ = false;  // stage_inputs ran since the last run()
  cublasLtHandle_t blas_ = nullptr;
  Tally tally_;
  DeviceBlock workspace_, arena_, scratch_, step_scalars_;
  static constexpr int kScalarSlots = 8;
  std::unique_ptr<PinnedBlock> step_scalars_host_;  // kScalarSlots StepScalars
  cudaEvent_t step_scalars_sent_[kScalarSlots] = {};
  int next_scalar_slot_ = 0;
  StreamGraphs graphs_;
  std::vector<DeviceBlock> compute_, grads_;
  std::map<ValueId, DeviceBlock> inputs_;
  std::map<ValueId, std::unique_ptr<PinnedBlock>> staging_[2];  // page-locked copies of the inputs, two slots
  cudaEvent_t staging_copied_[2] = {};                          // each slot's last copy to the device
  int staging_slot_ = 0;
  std::map<ValueId, std::unique_ptr<PinnedBlock>> host_values_;
  std::map<std::string, std::vector<void*>> last_run_;
  // keep_value's slots (value_f32's among them): page-locked copies on their way, and their f32
  // form once read.
  struct KeptValue {
    std::unique_ptr<PinnedBlock> block;
    cudaEvent_t copied = nullptr;
    DType type = DType::f32;
    int64_t count = 0;
    std::vector<float> values;
  };
  std::map<int, KeptValue> kept_;
  bool register_failure_said_ = false;
  std::vector<void*> registered_;
  std::deque<DeviceBlock> extra_;  // allocate()'s blocks
  bool resident_ = false;
  std::vector<cudaEvent_t> uploaded_;          // per unit: its parameters' last upload is done
  std::set<size_t> uploading_;                 // units whose upload the stream has not waited for yet
  bool parameters_uploaded_ = false;           // a staged run's: the store's parameters are on the device as they are
  DevicePlanActions* plan_actions_ = nullptr;  // a resident run's, where it has any (the device optimizer)
  std::vector<std::vector<size_t>> unit_params_;  // per unit, its parameters' indices
  StagingMirrors mirrors_;
  std::map<int, ValueId> reducing_;  // unit -> the buffer its reduce-scatter's mirror holds
  struct Download {                  // a reduce-scatter's gradients on their way to its mirror
    StepAction action;
    std::byte* mirror;
  };
  std::optional<Download> downloading_;
  cudaEvent_t downloaded_ = nullptr;  // recorded on the download stream after its copy
  // A staged run's gradient downloads (download()): their stream, the compute stream's event each
  // waits for, and the event the compute stream waits for at the run's end.
  cudaStream_t download_stream_ = nullptr;
  cudaEvent_t gradients_written_ = nullptr, downloads_done_ = nullptr;
  std::set<size_t> downloads_pending_;            // ZeRO 0-1: units not downloaded yet this run
  std::vector<std::vector<size_t>> finished_at_;  // per plan position: the units whose gradients are complete after it
  std::vector<StepAction> deferred_;              // the store's reductions and their waits, run after the plan
  std::set<int> deferred_units_;
  DeviceTimes times_;
  F32Copies copies_;
};

}  // namespace

std::unique_ptr<DeviceRunner> make_device_runner(const Graph& graph, ParameterStore& parameters, int index) {
  return std::make_unique<CudaRunner>(graph, parameters, index);
}

}  // namespace engine
