// The device optimizer of a CUDA build (optim/device_optimizer.h): host code that allocates the
// device state and sequences the kernels of optim/update_kernels.cu on the runner's stream.
#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda_convert.h"
#include "dist/shard_layout.h"
#include "optim/device_optimizer.h"
#include "optim/device_update.h"

namespace engine {
namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw InternalError("CUDA " + what + ": " + cudaGetErrorString(status));
}

class CudaOptimizer final : public DeviceOptimizer {
 public:
  CudaOptimizer(const recipe::OptimizerSection& config, ParameterStore& store, Optimizer& host, DeviceRunner& runner,
                int64_t accumulation)
      : config_(config),
        store_(store),
        host_(host),
        runner_(runner),
        stream_(static_cast<cudaStream_t>(runner.stream())),
        segments_(decay_segments(store, config)) {
    ENGINE_CHECK(store.layout().world() == 1 && store.sharding().stage <= 1,
                 "the device optimizer runs one process at ZeRO stage 0-1");
    const size_t units = store.graph().units().size();
    const size_t tensors = host.state().size();
    state_.resize(tensors);
    for (size_t u = 0; u < units; ++u) {
      const int64_t n = store.range_size(u);
      ENGINE_CHECK(n == store.layout().padded(u), "the device optimizer updates whole units");
      master_.push_back(store_.param_dtype() == DType::f32 ? reinterpret_cast<float*>(runner.parameters(u))
                                                           : f32_block(n, "the fp32 master weights"));
      for (size_t k = 0; k < tensors; ++k) state_[k].push_back(f32_block(n, "the optimizer state"));
      std::byte* sum = accumulation > 1
                           ? runner.allocate(n * int64_t(dtype_size(store_.grad_dtype())), "the gradient sum")
                           : runner.gradients(u);
      grad_sum_.push_back(sum);
      opt_grad_.push_back(store_.grad_dtype() == DType::f32 ? reinterpret_cast<float*>(sum)
                                                            : f32_block(n, "the fp32 gradients"));
      blocks_ += n / kShardBlock;
    }
    partials_ =
        reinterpret_cast<double*>(runner.allocate(blocks_ * int64_t(sizeof(double)), "the norm's partial sums"));
  }

  void upload() override {
    copy_state(cudaMemcpyHostToDevice);
    synchronize("upload of the model state");
  }

  void download() override {
    copy_state(cudaMemcpyDeviceToHost);
    synchronize("download of the model state");
  }

  void add_micro_batch(int64_t micro) override {
    for (size_t u = 0; u < grad_sum_.size(); ++u) {
      if (grad_sum_[u] == runner_.gradients(u)) continue;  // one micro-batch: the sum is its gradient
      const int64_t n = store_.range_size(u);
      if (micro == 0)
        check(cudaMemcpyAsync(grad_sum_[u], runner_.gradients(u), size_t(n) * dtype_size(store_.grad_dtype()),
                              cudaMemcpyDeviceToDevice, stream_),
              "gradient sum");
      else
        cuda::accumulate_gradients(grad_sum_[u], runner_.gradients(u), store_.grad_dtype(), n, stream_);
    }
  }

  std::vector<double> finish_gradients() override {
    for (size_t u = 0; u < opt_grad_.size(); ++u)
      if (store_.grad_dtype() != DType::f32)
        cuda::widen(grad_sum_[u], store_.grad_dtype(), opt_grad_[u], store_.range_size(u), stream_);
    return norm_partials(opt_grad_);
  }

  std::vector<double> master_norm_partials() override { return norm_partials(master_); }

 private:
  // Per unit, the partial sums of squares of `buffers` per kShardBlock block, in unit order.
  std::vector<double> norm_partials(const std::vector<float*>& buffers) {
    int64_t at = 0;
    for (size_t u = 0; u < buffers.size(); ++u) {
      const int64_t blocks = store_.range_size(u) / kShardBlock;
      cuda::norm_partials(buffers[u], blocks, partials_ + at, stream_);
      at += blocks;
    }
    std::vector<double> partials(static_cast<size_t>(blocks_), 0.0);
    check(
        cudaMemcpyAsync(partials.data(), partials_, partials.size() * sizeof(double), cudaMemcpyDeviceToHost, stream_),
        "norm partials");
    synchronize("norm partial sums");
    return partials;
  }

 public:
  void download_gradients() override { copy_gradients(cudaMemcpyDeviceToHost); }
  void upload_gradients() override { copy_gradients(cudaMemcpyHostToDevice); }

  void scale_gradients(double factor) override {
    for (size_t u = 0; u < opt_grad_.size(); ++u)
      cuda::scale(opt_grad_[u], store_.range_size(u), float(factor), stream_);
  }

  void step(double lr) override {
    const int64_t t = host_.steps() + 1;
    if (config_.type == recipe::OptimizerType::adamw) {
      const AdamWScalars with_decay = adamw_scalars(config_, lr, t, true);
      const AdamWScalars without_decay = adamw_scalars(config_, lr, t, false);
      for (const Segment& s : segments_)
        cuda::adamw_update(master_[s.unit] + s.begin, opt_grad_[s.unit] + s.begin, state_[0][s.unit] + s.begin,
                           state_[1][s.unit] + s.begin, s.end - s.begin, s.decay ? with_decay : without_decay, stream_);
    } else {
      for (const Segment& s : segments_) {
        const SgdScalars scalars{.lr = float(lr),
                                 .decay = s.decay ? float(config_.weight_decay) : 0.0f,
                                 .momentum = float(config_.momentum),
                                 .nesterov = config_.nesterov,
                                 .first = t == 1};
        cuda::sgd_update(master_[s.unit] + s.begin, opt_grad_[s.unit] + s.begin,
                         state_.empty() ? nullptr : state_[0][s.unit] + s.begin, s.end - s.begin, scalars, stream_);
      }
    }
    if (store_.param_dtype() != DType::f32)
      for (size_t u = 0; u < master_.size(); ++u)
        cuda::narrow(master_[u], runner_.parameters(u), store_.param_dtype(), store_.range_size(u), stream_);
    host_.set_steps(t);
  }

 private:
  float* f32_block(int64_t n, const std::string& what) {
    return reinterpret_cast<float*>(runner_.allocate(n * 4, what));
  }

  void synchronize(const std::string& what) { check(cudaStreamSynchronize(stream_), what); }

  // The masters (and in 16-bit the compute copies) and the optimizer state, one way or the other.
  void copy_state(cudaMemcpyKind kind) {
    const bool up = kind == cudaMemcpyHostToDevice;
    auto copy = [&](void* device, void* host, size_t bytes, const char* what) {
      ENGINE_CHECK(host, std::string("the device optimizer needs the host's ") + what);
      check(cudaMemcpyAsync(up ? device : host, up ? host : device, bytes, kind, stream_), what);
    };
    const std::vector<Optimizer::StateTensor> state = host_.state();
    for (size_t u = 0; u < master_.size(); ++u) {
      const auto n = size_t(store_.range_size(u));
      copy(master_[u], store_.master(u), n * 4, "master weights");
      if (store_.param_dtype() != DType::f32)
        copy(runner_.parameters(u), store_.compute(u), n * dtype_size(store_.param_dtype()), "parameter copies");
      for (size_t k = 0; k < state.size(); ++k) copy(state_[k][u], state[k].units[u], n * 4, "optimizer state");
    }
  }

  void copy_gradients(cudaMemcpyKind kind) {
    const bool up = kind == cudaMemcpyHostToDevice;
    for (size_t u = 0; u < opt_grad_.size(); ++u) {
      const auto bytes = size_t(store_.range_size(u)) * 4;
      check(cudaMemcpyAsync(up ? static_cast<void*>(opt_grad_[u]) : store_.opt_grad(u),
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
  int64_t blocks_ = 0;
};

}  // namespace

std::unique_ptr<DeviceOptimizer> make_device_optimizer(const recipe::OptimizerSection& config, ParameterStore& store,
                                                       Optimizer& host, DeviceRunner& runner, int64_t accumulation) {
  return std::make_unique<CudaOptimizer>(config, store, host, runner, accumulation);
}

}  // namespace engine
