// The device optimizer of a CUDA build (optim/device_optimizer.h): host code that allocates the
// device state and sequences the kernels of optim/update_kernels.cu on the runner's stream.
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "core/error.h"
#include "cuda_convert.h"
#include "dist/shard_layout.h"
#include "optim/device_optimizer.h"
#include "optim/device_update.h"
#include "runtime/cuda_check.h"
#include "runtime/stream_graphs.h"

namespace engine {
namespace {

class CudaOptimizer final : public DeviceOptimizer, public DevicePlanActions {
 public:
  CudaOptimizer(const recipe::OptimizerSection& config, ParameterStore& store, Optimizer& host, DeviceRunner& runner,
                int64_t accumulation, Communicator* collectives)
      : config_(config),
        store_(store),
        host_(host),
        runner_(runner),
        stream_(static_cast<cudaStream_t>(runner.stream())),
        segments_(decay_segments(store, config)),
        accumulation_(accumulation),
        stage_(store.sharding().stage),
        collectives_(collectives) {
    const int world = store.layout().world();
    ENGINE_CHECK(!store.masters_offloaded() && !store.shard_offloaded() && (world == 1 || collectives),
                 "the device optimizer runs without offload, several ranks reducing through a device communicator");
    ENGINE_CHECK(!collectives || (collectives->size() == world && collectives->rank() == store.layout().rank()),
                 "the device communicator spans the data-parallel ranks, in the shard layout's order");
    const size_t units = store.graph().units().size();
    const size_t tensors = host.state().size();
    state_.resize(tensors);
    for (size_t u = 0; u < units; ++u)  // stage 1 on several ranks: each rank's range is its shard
      if (store.range_size(u) != store.layout().padded(u)) sharded_ = true;
    const bool f32 = store_.param_dtype() == DType::f32;
    for (size_t u = 0; u < units; ++u) {
      const int64_t n = store.range_size(u);
      // fp32 at stages 0-2: the masters are the compute-type parameters' range. ZeRO-3 keeps only
      // the shard that its gathers read: the masters themselves in fp32, else a 16-bit copy.
      master_.push_back(f32 && stage_ < 3 ? reinterpret_cast<float*>(range_of(runner.parameters(u), u, 4))
                                          : f32_block(n, "the fp32 master weights"));
      if (stage_ == 3)
        shard_.push_back(f32 ? reinterpret_cast<std::byte*>(master_.back())
                             : runner.allocate(n * int64_t(dtype_size(store_.param_dtype())), "the parameters' shard"));
      for (size_t k = 0; k < tensors; ++k) state_[k].push_back(f32_block(n, "the optimizer state"));
      // Reduced sums land in buffers of their own (a reduce-scatter reads every rank's whole
      // gradient; ZeRO-2/3's micro-batch gradients are arena buffers, reused once reduced).
      std::byte* sum = accumulation > 1 || collectives || stage_ >= 2
                           ? runner.allocate(n * int64_t(dtype_size(store_.grad_dtype())), "the gradient sum")
                           : runner.gradients(u);
      grad_sum_.push_back(sum);
      // fp32 gradients are the sum itself; a 16-bit run's, which only a hook that reads or changes
      // the gradients before the update needs, are made at its first such step (f32_gradients()).
      if (store_.grad_dtype() == DType::f32) opt_grad_.push_back(reinterpret_cast<float*>(sum));
      blocks_ += partial_blocks(u);
      padded_blocks_ += store.layout().padded(u) / kShardBlock;
      whole_blocks_ += store.layout().value_blocks(u);
    }
    partials_ =
        reinterpret_cast<double*>(runner.allocate(blocks_ * int64_t(sizeof(double)), "the norm's partial sums"));
    // Sharded: every rank's shard partials gathered per unit (unit, rank, block), then each unit's
    // value blocks (ShardLayout::value_blocks) copied out: one process's list.
    if (sharded_) {
      padded_partials_ = reinterpret_cast<double*>(
          runner.allocate(padded_blocks_ * int64_t(sizeof(double)), "every rank's norm partial sums"));
      whole_partials_ = reinterpret_cast<double*>(
          runner.allocate(whole_blocks_ * int64_t(sizeof(double)), "the norm's partial sums, whole"));
    } else {
      whole_partials_ = partials_;
    }
    chunk_sums_ = reinterpret_cast<double*>(runner.allocate(
        std::max<int64_t>(norm_chunks(whole_blocks_), 1) * int64_t(sizeof(double)), "the norm's chunk sums"));
    scalars_ =
        reinterpret_cast<MultiTensorScalars*>(runner.allocate(sizeof(MultiTensorScalars), "the update's scalars"));
    check_cuda(cudaMallocHost(&scalars_host_, sizeof(MultiTensorScalars)), "pinned scalars");
    check_cuda(cudaMallocHost(&decision_host_, sizeof(UpdateDecision)), "pinned decision");
    check_cuda(cudaMallocHost(&partials_host_, size_t(std::max<int64_t>(whole_blocks_, 1)) * sizeof(double)),
               "pinned partials");
    check_cuda(cudaEventCreateWithFlags(&decided_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&scalars_sent_, cudaEventDisableTiming), "event");
    sum_table_ = upload_chunk_table(as_const(grad_sum_), int64_t(dtype_size(store_.grad_dtype())));
    if (store_.grad_dtype() == DType::f32) f32_table_ = sum_table_;
  }

  ~CudaOptimizer() override {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(decided_);
    cudaEventDestroy(scalars_sent_);
    cudaFreeHost(scalars_host_);
    cudaFreeHost(decision_host_);
    cudaFreeHost(partials_host_);
  }

  void use_graphs(bool on) override { graphs_.set_enabled(on); }
  void reset_graphs() override { graphs_.reset(); }
  int64_t graph_replays() const override { return graphs_.replays(); }

  void upload() override {
    copy_state(cudaMemcpyHostToDevice);
    synchronize("upload of the model state");
  }

  void download() override {
    copy_state(cudaMemcpyDeviceToHost);
    synchronize("download of the model state");
  }

  DevicePlanActions* plan_actions() override { return stage_ >= 2 || collectives_ ? this : nullptr; }

  void begin_micro_batch(int64_t micro) override {
    micro_ = micro;
    // A step that skipped its update (an overflow, a plugin's veto) never read the gradients a hook
    // uploaded: this step's update reads its own sums.
    if (micro == 0) update_from_f32_ = false;
    // A step that threw part-way may have left the plan's collectives started but never used or
    // waited for: drain them, so this step starts from none and reduces every micro-batch.
    if (micro == 0 && (!gathering_.empty() || !reducing_.empty() || reduced_in_plan_)) {
      for (auto& [buffer, work] : gathering_) in_flight_.push_back(work);
      for (auto& [unit, work] : reducing_) in_flight_.push_back(work);
      gathering_.clear();
      reducing_.clear();
      reduced_in_plan_ = false;
      wait_for_collectives();
    }
  }
  void add_micro_batch(int64_t micro) override {
    const bool reduced_in_plan = std::exchange(reduced_in_plan_, false);
    if (stage_ >= 2) return;  // the plan reduced each unit where its backward finished (reduce())
    if (collectives_) return reduce_micro_batch(micro, reduced_in_plan);
    if (accumulation_ == 1) return;  // one micro-batch: the sum is its gradient, where it is
    graphs_.run(micro == 0 ? "first micro-batch's gradients" : "a micro-batch's gradients", stream_, [&] {
      for (size_t u = 0; u < grad_sum_.size(); ++u) add_to_sum(u, runner_.gradients(u), micro);
    });
  }

  std::vector<double> finish_gradients() override {
    if (update_from_f32_)  // a hook uploaded fp32 gradients: the update reads those
      enqueue_norm_partials(as_const(opt_grad_), DType::f32);
    else
      graphs_.run("gradient finish", stream_, [&] { enqueue_sum_partials(); });
    gather_partials("gradient");
    download_partials();
    return read_partials();
  }

  std::vector<double> master_norm_partials() override {
    enqueue_norm_partials(as_const(master_), DType::f32);
    gather_partials("master");
    download_partials();
    return read_partials();
  }

 private:
  // A multi-tensor update's table (optim/update_chunks.h) over the gradients `g` of `grad_size`
  // bytes each, in device memory for the optimizer's life: its arrays never move. The kernel takes
  // the gradients' type when it is enqueued (fp16's fallback retypes a run's 2-byte sums to bf16).
  struct ChunkTable {
    UpdateChunk* chunks = nullptr;
    int64_t count = 0;
  };
  ChunkTable upload_chunk_table(const std::vector<const void*>& g, int64_t grad_size) {
    std::vector<UpdateArrays> units(master_.size());
    for (size_t u = 0; u < units.size(); ++u) {
      units[u].w = master_[u];
      units[u].g = g[u];
      units[u].m = state_.empty() ? nullptr : state_[0][u];  // AdamW's first moment, SGD's momentum
      units[u].v = state_.size() > 1 ? state_[1][u] : nullptr;
      units[u].copy = store_.param_dtype() == DType::f32 ? nullptr : compute_range(u);
    }
    const std::vector<UpdateChunk> table =
        plan_update_chunks(segments_, units, int64_t(dtype_size(store_.param_dtype())), grad_size);
    ChunkTable out{.count = int64_t(table.size())};
    const size_t bytes = std::max<size_t>(table.size(), 1) * sizeof(UpdateChunk);
    out.chunks = reinterpret_cast<UpdateChunk*>(runner_.allocate(int64_t(bytes), "the update's chunk table"));
    // On the legacy stream, after the block's zeroing there. From pageable memory the call may
    // return before the copy lands, and the runner's stream is not ordered after the legacy one:
    // the legacy stream is synchronised before any update reads the table.
    check_cuda(cudaMemcpy(out.chunks, table.data(), table.size() * sizeof(UpdateChunk), cudaMemcpyHostToDevice),
               "the update's chunk table");
    check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "the update's chunk table");
    return out;
  }

  // The fp32 gradients of a 16-bit run, and the update's table over them, made at the first step
  // whose hooks read or change the gradients before the update (a gradient dump, a plugin's
  // after_backward): 4 bytes a parameter beyond engine plan's device memory.
  void f32_gradients() {
    if (f32_table_.chunks) return;  // made, or the sums are fp32 themselves
    for (size_t u = 0; u < grad_sum_.size(); ++u)
      opt_grad_.push_back(f32_block(store_.range_size(u), "the fp32 gradients"));
    f32_table_ = upload_chunk_table(as_const(opt_grad_), 4);
  }
  template <class T>
  static std::vector<const void*> as_const(const std::vector<T*>& buffers) {
    return std::vector<const void*>(buffers.begin(), buffers.end());
  }

  // One process: unit u's micro-batch gradients (the whole unit) copied into its own sum buffer at
  // the step's first micro-batch, added onto it after.
  void add_to_sum(size_t u, const std::byte* gradients, int64_t micro) {
    const int64_t n = store_.range_size(u);
    if (micro == 0)
      check_cuda(cudaMemcpyAsync(grad_sum_[u], gradients, size_t(n) * dtype_size(store_.grad_dtype()),
                                 cudaMemcpyDeviceToDevice, stream_),
                 "gradient sum");
    else
      cuda::accumulate_gradients(grad_sum_[u], gradients, store_.grad_dtype(), n, stream_);
  }

  // Several ranks at stages 0-1, after a micro-batch's run: each unit's gradients reduce-scattered
  // into this rank's shard of the sum (start_reduce), unless the plan did it where each unit's
  // backward finished (reduce(); a plan has no reductions on one process accumulating one
  // micro-batch through a named communicator); then, at stage 0 after the last micro-batch, every
  // shard gathered in place, so the sum is whole on every rank. The gathers come after the plan so
  // that no wait of the plan stalls the backward behind them (they queue behind its reduce-scatters).
  // Enqueued eagerly (outside the phases' graphs: the staged communicator copies through the host);
  // the runner's stream waits for each collective before its next kernels, so the next backward
  // writes the gradients only once they are read.
  void reduce_micro_batch(int64_t micro, bool reduced_in_plan) {
    std::vector<Work> works;
    if (!reduced_in_plan)
      for (size_t u = 0; u < grad_sum_.size(); ++u) works.push_back(start_reduce(u, runner_.gradients(u), micro));
    if (gathers_sums(micro))
      for (size_t u = 0; u < grad_sum_.size(); ++u) works.push_back(gather_sum(u));
    follow(works);
  }
  // Unit u's micro-batch gradients (the whole padded unit: the runner's buffer, or a ZeRO-2/3 arena
  // buffer) reduce-scattered into this rank's shard of the step's sum, overwriting it at the step's
  // first micro-batch and adding onto it after.
  Work start_reduce(size_t u, const std::byte* gradients, int64_t micro) {
    const auto element = int64_t(dtype_size(store_.grad_dtype()));
    const ShardLayout& layout = store_.layout();
    return collectives_->reduce_scatter(gradients, grad_sum_[u] + (layout.begin(u) - store_.range_begin(u)) * element,
                                        layout.shard(u), store_.grad_dtype(),
                                        micro == 0 ? Reduction::overwrite : Reduction::accumulate,
                                        "reduce-scatter of " + unit_name(u) + "'s gradients", Stream{stream_});
  }
  // Stage 0 updates the whole unit on every rank: after the step's last micro-batch, every rank's
  // shard of the sum is gathered in place.
  bool gathers_sums(int64_t micro) const { return stage_ < 2 && !sharded_ && micro + 1 == accumulation_; }
  Work gather_sum(size_t u) {
    const auto element = int64_t(dtype_size(store_.grad_dtype()));
    const ShardLayout& layout = store_.layout();
    return collectives_->all_gather(grad_sum_[u] + layout.begin(u) * element, grad_sum_[u], layout.shard(u) * element,
                                    "all-gather of " + unit_name(u) + "'s reduced gradients", Stream{stream_});
  }
  std::string unit_name(size_t u) const { return "unit " + store_.graph().units()[u].name; }

 public:
  // The plan's actions, where the runner's plan places them (runtime/device_runner.h): ZeRO-2/3's,
  // and the reductions of ranks reducing through `collectives_` at any stage. One process at
  // stage 2-3 without a communicator copies and adds on the stream itself: the bits of its stages
  // 0-1.
  void gather(int unit, std::byte* into) override {
    const auto u = size_t(unit);
    const int64_t bytes = store_.layout().shard(u) * int64_t(dtype_size(store_.param_dtype()));
    if (!collectives_) {  // one process: the shard is the whole unit
      check_cuda(cudaMemcpyAsync(into, shard_.at(u), size_t(bytes), cudaMemcpyDeviceToDevice, stream_),
                 "gather of " + unit_name(u));
      return;
    }
    // Keyed by the buffer: with distributed.prefetch above 1 a unit read by two clusters (a tied
    // head, an untied last block around the head) has two gathers in flight.
    ENGINE_CHECK(!gathering_.count(into), unit_name(u) + "'s buffer is gathered into twice before its use");
    gathering_.emplace(
        into, collectives_->all_gather(shard_.at(u), into, bytes, "all-gather of " + unit_name(u) + "'s parameters",
                                       Stream{stream_}));
  }
  void use_params(int unit, const std::byte* gathered) override { follow_one(gathering_, gathered, unit); }
  void reduce(int unit, const std::byte* gradients) override {
    const auto u = size_t(unit);
    reduced_in_plan_ = true;
    if (!gradients) gradients = runner_.gradients(u);            // stages 0-1: the runner's buffer of the unit
    if (!collectives_) return add_to_sum(u, gradients, micro_);  // one process (stages 2-3)
    ENGINE_CHECK(!reducing_.count(unit), unit_name(u) + " is reduced twice before its wait");
    reducing_.emplace(unit, start_reduce(u, gradients, micro_));
  }
  void wait(int unit) override { follow_one(reducing_, unit, unit); }

 private:
  // The runner's stream waits for the collective of `unit` started under `key` (none on one process).
  template <class Key>
  void follow_one(std::map<Key, Work>& started, Key key, int unit) {
    const auto found = started.find(key);
    if (found == started.end()) {
      ENGINE_CHECK(!collectives_,
                   "the plan waits for a collective of unit " + std::to_string(unit) + " it never started");
      return;
    }
    std::vector<Work> one{found->second};
    started.erase(found);
    follow(one);
  }
  // The runner's stream waits for `works` (collectives just started), and the host will wait for
  // them through their handles before it next blocks on the stream (wait_for_collectives).
  void follow(std::vector<Work>& works) {
    for (Work& work : works) {
      work.wait_on(Stream{stream_});
      in_flight_.push_back(work);
    }
  }

 public:
  // Each through its Work, which polls within distributed.timeout and NCCL's asynchronous errors:
  // a peer that never reaches a collective is named, rather than the host hanging on the stream.
  void wait_for_collectives() override {
    for (Work& work : in_flight_) work.wait();
    in_flight_.clear();
  }

 private:
  // The partial sums a unit's range gives: its shard's blocks (sharded), else the blocks that hold
  // values (not the padding after them: ShardLayout::value_blocks).
  int64_t partial_blocks(size_t u) const {
    return sharded_ ? store_.range_size(u) / kShardBlock : store_.layout().value_blocks(u);
  }
  // Per unit, the partial sums of squares of `buffers` (each unit's range) per kShardBlock block, in
  // unit order.
  void enqueue_norm_partials(const std::vector<const void*>& buffers, DType type) {
    int64_t at = 0;
    for (size_t u = 0; u < buffers.size(); ++u) {
      cuda::norm_partials(buffers[u], type, partial_blocks(u), partials_ + at, stream_);
      at += partial_blocks(u);
    }
  }
  // Sharded: every rank's partial sums of each unit gathered at the unit's place, rank after rank
  // (the unit's blocks in order), then each unit's value blocks copied into whole_partials_: the
  // list one process sums (ZeroStep::gradient_norm's). Eager, outside the phases' graphs.
  void gather_partials(const std::string& what) {
    if (!sharded_) return;
    const ShardLayout& layout = store_.layout();
    const Stream stream{stream_};
    std::vector<Work> works;
    int64_t mine = 0, padded = 0;
    for (size_t u = 0; u < grad_sum_.size(); ++u) {
      works.push_back(collectives_->all_gather(
          partials_ + mine, padded_partials_ + padded, partial_blocks(u) * int64_t(sizeof(double)),
          "all-gather of " + unit_name(u) + "'s " + what + " norm partial sums", stream));
      mine += partial_blocks(u);
      padded += layout.padded(u) / kShardBlock;
    }
    follow(works);
    int64_t whole = 0;
    padded = 0;
    for (size_t u = 0; u < grad_sum_.size(); ++u) {
      check_cuda(cudaMemcpyAsync(whole_partials_ + whole, padded_partials_ + padded,
                                 size_t(layout.value_blocks(u)) * sizeof(double), cudaMemcpyDeviceToDevice, stream_),
                 "the norm's value blocks");
      whole += layout.value_blocks(u);
      padded += layout.padded(u) / kShardBlock;
    }
  }
  // One process's list of partial sums into the pinned host copy (read_partials(), or
  // finish_and_step's wait for the decision, waits for it).
  void download_partials() {
    check_cuda(cudaMemcpyAsync(partials_host_, whole_partials_, size_t(whole_blocks_) * sizeof(double),
                               cudaMemcpyDeviceToHost, stream_),
               "norm partials");
  }
  // The norm's partial sums of the step's gradient sum, in its type.
  void enqueue_sum_partials() { enqueue_norm_partials(as_const(grad_sum_), store_.grad_dtype()); }
  std::vector<double> partials_on_host() const {
    return std::vector<double>(partials_host_, partials_host_ + whole_blocks_);
  }
  std::vector<double> read_partials() {
    synchronize("norm partial sums");
    return partials_on_host();
  }

 public:
  void download_gradients() override {
    f32_gradients();
    widen_gradients();
    copy_gradients(cudaMemcpyDeviceToHost);
  }
  // The hook's gradients, which this step's update then reads (in fp32).
  void upload_gradients() override {
    f32_gradients();
    copy_gradients(cudaMemcpyHostToDevice);
    update_from_f32_ = true;
  }

  void step(double lr, double factor) override {
    MultiTensorScalars& s = write_scalars(lr);
    s.decision = UpdateDecision{.factor = factor};
    send_scalars();
    run_update();
    host_.set_steps(host_.steps() + 1);
  }

  StepEnd finish_and_step(double lr, const StepPolicy& policy) override {
    write_scalars(lr).policy = policy;
    send_scalars();
    // The norm and the update read the step's sum where it is, in the gradient type.
    auto decide = [&] {
      download_partials();
      cuda::decide_update(whole_partials_, whole_blocks_, chunk_sums_, scalars_, stream_);
    };
    if (!sharded_) {
      graphs_.run("gradient finish and decision", stream_, [&] {
        enqueue_sum_partials();
        decide();
      });
    } else {  // every rank's partial sums gathered between the two
      graphs_.run("gradient finish", stream_, [&] { enqueue_sum_partials(); });
      gather_partials("gradient");
      graphs_.run("decision", stream_, decide);
    }
    check_cuda(
        cudaMemcpyAsync(decision_host_, &scalars_->decision, sizeof(UpdateDecision), cudaMemcpyDeviceToHost, stream_),
        "the step's decision");
    check_cuda(cudaEventRecord(decided_, stream_), "event record");
    wait_for_collectives();  // what the decision waits for (the parameters' gathers after the update stay in flight)
    run_update();
    runner_.wait(decided_, "the step's decision");
    StepEnd end{partials_on_host(), *decision_host_};
    if (!end.decision.skip) host_.set_steps(host_.steps() + 1);
    return end;
  }

 private:
  // The update's scalars for the next step at `lr`, in the pinned slot, once the last copy out of it
  // is done (a step that decided on the device waited past it; one whose update the host decided
  // did not wait after it).
  MultiTensorScalars& write_scalars(double lr) {
    const cudaError_t sent = cudaEventQuery(scalars_sent_);
    if (sent == cudaErrorNotReady)
      runner_.wait(scalars_sent_, "the last update's scalars");
    else
      check_cuda(sent, "the last update's scalars");
    const int64_t t = host_.steps() + 1;
    MultiTensorScalars& s = *scalars_host_;
    s = MultiTensorScalars{};
    if (config_.type == recipe::OptimizerType::adamw) {
      s.adamw[1] = adamw_scalars(config_, lr, t, true);
      s.adamw[0] = adamw_scalars(config_, lr, t, false);
    } else {
      const SgdScalars sgd{.lr = float(lr),
                           .decay = 0.0f,
                           .momentum = float(config_.momentum),
                           .nesterov = config_.nesterov,
                           .first = t == 1};
      s.sgd[0] = s.sgd[1] = sgd;
      s.sgd[1].decay = float(config_.weight_decay);
    }
    return s;
  }
  void send_scalars() {
    check_cuda(cudaMemcpyAsync(scalars_, scalars_host_, sizeof(MultiTensorScalars), cudaMemcpyHostToDevice, stream_),
               "the update's scalars");
    check_cuda(cudaEventRecord(scalars_sent_, stream_), "event record");
  }

  void widen_gradients() {
    for (size_t u = 0; u < opt_grad_.size(); ++u)
      if (store_.grad_dtype() != DType::f32)
        cuda::widen(grad_sum_[u], store_.grad_dtype(), opt_grad_[u], store_.range_size(u), stream_);
  }

  // The update phase: over the fp32 gradients a hook wrote back this step, else over the step's
  // sums. The gradients' type is read when the phase is enqueued or captured: fp16's fallback
  // retypes the sums to bf16 and resets the graphs.
  void run_update() {
    const bool from_f32 = update_from_f32_;
    update_from_f32_ = false;
    const ChunkTable& table = from_f32 ? f32_table_ : sum_table_;
    const DType grad_type = from_f32 ? DType::f32 : store_.grad_dtype();
    graphs_.run(from_f32 ? "update of the fp32 gradients" : "update of the gradient sums", stream_, [&] {
      cuda::update_chunks(table.chunks, table.count, config_.type == recipe::OptimizerType::adamw, scalars_,
                          store_.param_dtype(), grad_type, stream_);
    });
    if (sharded_ && stage_ < 3) gather_parameters();  // ZeRO-3 gathers each unit where the plan reads it
  }

  // Sharded: every rank's updated slice of the compute-type parameters, gathered in place (the next
  // micro-batch's kernels wait for them on the stream; a skipped update gathers them unchanged).
  void gather_parameters() {
    const ShardLayout& layout = store_.layout();
    const auto element = int64_t(dtype_size(store_.param_dtype()));
    std::vector<Work> works;
    for (size_t u = 0; u < master_.size(); ++u)
      works.push_back(collectives_->all_gather(
          runner_.parameters(u) + layout.begin(u) * element, runner_.parameters(u), layout.shard(u) * element,
          "all-gather of " + unit_name(u) + "'s updated parameters", Stream{stream_}));
    follow(works);
  }

 private:
  float* f32_block(int64_t n, const std::string& what) {
    return reinterpret_cast<float*>(runner_.allocate(n * 4, what));
  }
  // Unit u's optimizer range within a whole-unit device buffer of `element`-byte values.
  std::byte* range_of(std::byte* whole, size_t u, size_t element) const {
    return whole + store_.range_begin(u) * int64_t(element);
  }
  // The compute-type parameters of unit u's optimizer range: ZeRO-3's shard, else the range of the
  // whole unit the runner holds.
  std::byte* compute_range(size_t u) const {
    return stage_ == 3 ? shard_[u] : range_of(runner_.parameters(u), u, dtype_size(store_.param_dtype()));
  }

  void synchronize(const std::string& what) {
    wait_for_collectives();
    runner_.synchronize(what);
  }

  // The masters (and in 16-bit the compute copies) and the optimizer state, one way or the other.
  void copy_state(cudaMemcpyKind kind) {
    const bool up = kind == cudaMemcpyHostToDevice;
    auto copy = [&](void* device, void* host, size_t bytes, const char* what) {
      ENGINE_CHECK(host, std::string("the device optimizer needs the host's ") + what);
      check_cuda(cudaMemcpyAsync(up ? device : host, up ? host : device, bytes, kind, stream_), what);
    };
    const std::vector<Optimizer::StateTensor> state = host_.state();
    for (size_t u = 0; u < master_.size(); ++u) {
      const auto n = size_t(store_.range_size(u));
      // The whole unit's compute-type values (in an fp32 run, the masters are their range; ZeRO-3
      // holds the 16-bit shard alone), then the range's masters.
      if (stage_ < 3 && (store_.param_dtype() != DType::f32 || sharded_))
        copy(runner_.parameters(u), store_.compute(u),
             size_t(store_.layout().padded(u)) * dtype_size(store_.param_dtype()), "parameter copies");
      if (stage_ == 3 && store_.param_dtype() != DType::f32)
        copy(shard_[u], store_.shard_copy(u), n * dtype_size(store_.param_dtype()), "the parameters' shard");
      copy(master_[u], store_.master(u), n * 4, "master weights");
      for (size_t k = 0; k < state.size(); ++k) copy(state_[k][u], state[k].units[u], n * 4, "optimizer state");
    }
  }

  void copy_gradients(cudaMemcpyKind kind) {
    const bool up = kind == cudaMemcpyHostToDevice;
    for (size_t u = 0; u < opt_grad_.size(); ++u) {
      const auto bytes = size_t(store_.range_size(u)) * 4;
      check_cuda(cudaMemcpyAsync(up ? static_cast<void*>(opt_grad_[u]) : store_.opt_grad(u),
                                 up ? static_cast<void*>(store_.opt_grad(u)) : opt_grad_[u], bytes, kind, stream_),
                 "gradients");
    }
    synchronize("gradients");
  }

  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  Optimizer& host_;
  DeviceRunner& runner_;
  cudaStream_t stream_;
  std::vector<Segment> segments_;
  std::vector<float*> master_, opt_grad_;
  std::vector<std::vector<float*>> state_;  // per state tensor, per unit
  std::vector<std::byte*> grad_sum_;
  double* partials_ = nullptr;
  int64_t blocks_ = 0;                 // partial sums of this rank's ranges (partials_)
  int64_t padded_blocks_ = 0;          // every rank's, padding included (sharded: padded_partials_)
  int64_t whole_blocks_ = 0;           // one process's list: the units' value blocks (whole_partials_)
  bool sharded_ = false;               // the ranges are shards (ZeRO-1 on several ranks)
  double* padded_partials_ = nullptr;  // sharded only
  double* whole_partials_ = nullptr;   // partials_ itself unless sharded
  int64_t accumulation_ = 1;
  int stage_ = 0;                        // the ZeRO stage
  std::vector<std::byte*> shard_;        // ZeRO-3: each unit's compute-type shard, which its gathers read
  bool reduced_in_plan_ = false;         // this micro-batch's plan reduced its units (reduce())
  int64_t micro_ = 0;                    // the micro-batch of the step the runs compute (begin_micro_batch)
  Communicator* collectives_ = nullptr;  // several ranks' reductions (null: one process)
  std::vector<Work> in_flight_;          // its operations since the host last waited
  // The plan's collectives not yet used (ZeRO-3's gathers, by buffer) or waited for (reductions, by unit).
  std::map<const std::byte*, Work> gathering_;
  std::map<int, Work> reducing_;
  double* chunk_sums_ = nullptr;                // decide_update's
  ChunkTable sum_table_;                        // the update over the step's gradient sum, in the gradient type
  ChunkTable f32_table_;                        // ... over the fp32 gradients a hook changed (the same table in fp32)
  bool update_from_f32_ = false;                // this step's hook uploaded gradients: the update reads them
  MultiTensorScalars* scalars_ = nullptr;       // device
  MultiTensorScalars* scalars_host_ = nullptr;  // pinned
  UpdateDecision* decision_host_ = nullptr;     // pinned
  double* partials_host_ = nullptr;             // pinned
  cudaEvent_t decided_ = nullptr;               // the decision and partials are on their way to the host
  cudaEvent_t scalars_sent_ = nullptr;          // the copy out of scalars_host_ is done
  StreamGraphs graphs_;
};

}  // namespace

std::unique_ptr<DeviceOptimizer> make_device_optimizer(const recipe::OptimizerSection& config, ParameterStore& store,
                                                       Optimizer& host, DeviceRunner& runner, int64_t accumulation,
                                                       Communicator* collectives) {
  return std::make_unique<CudaOptimizer>(config, store, host, runner, accumulation, collectives);
}

}  // namespace engine
