#include "offload/offloaded_optimizer.h"

#include <algorithm>

#include "core/error.h"
#include "optim/update_kernels.h"

namespace engine {

std::vector<std::string> offloaded_kinds(const recipe::OptimizerSection& config, bool masters) {
  std::vector<std::string> kinds;
  if (masters) kinds.push_back("master");
  if (config.type == recipe::OptimizerType::adamw) {
    kinds.push_back("exp_avg");
    kinds.push_back("exp_avg_sq");
  } else if (config.momentum > 0) {
    kinds.push_back("momentum_buffer");
  }
  return kinds;
}

namespace {

class OffloadedOptimizer : public Optimizer {
 public:
  OffloadedOptimizer(const recipe::OptimizerSection& config, ParameterStore& store, OffloadedState& state)
      : config_(config), store_(store), state_(state), segments_(decay_segments(store, config)) {
    ENGINE_CHECK(state.kinds() == offloaded_kinds(config, store.masters_offloaded()),
                 "the offloaded state holds other kinds than the optimizer keeps");
  }

  void step(double lr) override {
    ++t_;
    const bool adamw = config_.type == recipe::OptimizerType::adamw;
    AdamWScalars with_decay{}, without_decay{};
    if (adamw) {
      with_decay = adamw_scalars(config_, lr, t_, true);
      without_decay = adamw_scalars(config_, lr, t_, false);
    }
    const int first_kind = store_.masters_offloaded() ? 1 : 0;
    ChunkStore* shard = store_.shard_offloaded() ? state_.params() : nullptr;
    size_t next = 0;  // the first segment that may reach into the chunk
    auto update = [&](const OffloadedState::Chunk& c) {
      const int64_t chunk_end = c.first + c.count;
      for (size_t i = next; i < segments_.size(); ++i) {
        const Segment& s = segments_[i];
        const int64_t base = state_.unit_base(s.unit);
        if (base + s.begin >= chunk_end) break;
        const int64_t lo = std::max(c.first, base + s.begin), hi = std::min(chunk_end, base + s.end);
        if (base + s.end <= chunk_end) next = i + 1;  // done with it for later chunks
        if (lo >= hi) continue;
        const int64_t at = lo - c.first, k = lo - base, n = hi - lo;  // in the chunk, in the unit's range
        float* w = first_kind ? c.kinds[0] + at : store_.master(s.unit) + k;
        const float* g = store_.opt_grad(s.unit) + k;
        if (adamw) {
          adamw_update(w, g, c.kinds[size_t(first_kind)] + at, c.kinds[size_t(first_kind) + 1] + at, n,
                       s.decay ? with_decay : without_decay);
        } else {
          float* buffer = c.kinds.size() > size_t(first_kind) ? c.kinds[size_t(first_kind)] + at : nullptr;
          sgd_update(w, g, buffer, n,
                     SgdScalars{.lr = float(lr),
                                .decay = s.decay ? float(config_.weight_decay) : 0.0f,
                                .momentum = float(config_.momentum),
                                .nesterov = config_.nesterov,
                                .first = t_ == 1});
        }
      }
      store_.write_copies(c.first, c.count, first_kind ? c.kinds[0] : nullptr, shard ? shard->put(c.index) : nullptr);
      if (shard) shard->commit(c.index);
    };
    if (state_.kinds().empty())
      state_.for_each_chunk(update);
    else
      state_.update(update, true);
    if (shard) shard->wait();  // the next gathers read what was just written
  }

  int64_t state_bytes() const override { return 0; }
  std::vector<StateTensor> state() override {
    std::vector<StateTensor> tensors;
    for (size_t k = store_.masters_offloaded() ? 1 : 0; k < state_.kinds().size(); ++k)
      tensors.push_back({state_.kinds()[k], {}, &state_, k});
    return tensors;
  }
  int64_t steps() const override { return t_; }
  void set_steps(int64_t steps) override { t_ = steps; }
  bool writes_copies() const override { return true; }

 private:
  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  OffloadedState& state_;
  std::vector<Segment> segments_;
  int64_t t_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_offloaded_optimizer(const recipe::OptimizerSection& config, ParameterStore& store,
                                                    OffloadedState& state) {
  return std::make_unique<OffloadedOptimizer>(config, store, state);
}

}  // namespace engine
