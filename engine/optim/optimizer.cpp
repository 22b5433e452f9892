#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/update_kernels.h"
#include "optim/update_math.h"

namespace engine {

namespace {

std::vector<float*> pointers(std::vector<Buffer>& buffers) {
  std::vector<float*> out;
  for (Buffer& b : buffers) out.push_back(b.f32());
  return out;
}

class AdamW : public Optimizer {
 public:
  AdamW(const recipe::OptimizerSection& config, ParameterStore& store)
      : config_(config), store_(store), segments_(decay_segments(store, config)) {
    for (size_t u = 0; u < store.graph().units().size(); ++u) {
      m_.emplace_back(store.range_size(u) * 4);
      v_.emplace_back(store.range_size(u) * 4);
    }
  }

  void step(double lr) override {
    ++t_;
    const AdamWScalars with_decay = adamw_scalars(config_, lr, t_, true);
    const AdamWScalars without_decay = adamw_scalars(config_, lr, t_, false);
    for (const Segment& s : segments_)
      adamw_update(store_.master(s.unit) + s.begin, store_.opt_grad(s.unit) + s.begin, m_[s.unit].f32() + s.begin,
                   v_[s.unit].f32() + s.begin, s.end - s.begin, s.decay ? with_decay : without_decay);
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const Buffer& b : m_) n += 2 * b.bytes();
    return n;
  }
  std::vector<StateTensor> state() override { return {{"exp_avg", pointers(m_)}, {"exp_avg_sq", pointers(v_)}}; }
  int64_t steps() const override { return t_; }
  void set_steps(int64_t steps) override { t_ = steps; }

 private:
  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  std::vector<Segment> segments_;
  std::vector<Buffer> m_, v_;
  int64_t t_ = 0;
};

class Sgd : public Optimizer {
 public:
  Sgd(const recipe::OptimizerSection& config, ParameterStore& store)
      : config_(config), store_(store), segments_(decay_segments(store, config)) {
    if (config.momentum > 0)
      for (size_t u = 0; u < store.graph().units().size(); ++u) momentum_.emplace_back(store.range_size(u) * 4);
  }

  void step(double lr) override {
    ++t_;
    for (const Segment& s : segments_) {
      float* buf = momentum_.empty() ? nullptr : momentum_[s.unit].f32() + s.begin;
      // PyTorch starts the momentum buffer at the first step's gradient.
      const SgdScalars scalars{.lr = float(lr),
                               .decay = s.decay ? float(config_.weight_decay) : 0.0f,
                               .momentum = float(config_.momentum),
                               .nesterov = config_.nesterov,
                               .first = t_ == 1};
      sgd_update(store_.master(s.unit) + s.begin, store_.opt_grad(s.unit) + s.begin, buf, s.end - s.begin, scalars);
    }
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const Buffer& b : momentum_) n += b.bytes();
    return n;
  }
  std::vector<StateTensor> state() override {
    if (momentum_.empty()) return {};
    return {{"momentum_buffer", pointers(momentum_)}};
  }
  int64_t steps() const override { return t_; }
  void set_steps(int64_t steps) override { t_ = steps; }

 private:
  const recipe::OptimizerSection& config_;
  ParameterStore& store_;
  std::vector<Segment> segments_;
  std::vector<Buffer> momentum_;
  int64_t t_ = 0;
};

}  // namespace

std::vector<Segment> decay_segments(const ParameterStore& store, const recipe::OptimizerSection& config) {
  std::vector<Segment> out;
  const Graph& g = store.graph();
  for (size_t u = 0; u < g.units().size(); ++u) {
    const int64_t first = store.range_begin(u), last = first + store.range_size(u);
    int64_t at = first;
    auto add = [&](int64_t end, bool decay) {
      if (end <= at) return;
      if (!out.empty() && out.back().unit == u && out.back().decay == decay)
        out.back().end = end - first;
      else
        out.push_back({u, at - first, end - first, decay});
      at = end;
    };
    for (size_t i = 0; i < g.params().size(); ++i) {
      const Param& p = g.params()[i];
      if (size_t(p.unit) != u) continue;
      const int64_t begin = std::clamp(p.offset, first, last);
      const int64_t end = std::clamp(p.offset + store.numel(int(i)), first, last);
      add(begin, false);
      add(end, config.decay_norms_and_biases || p.decay);
    }
    add(last, false);
  }
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const recipe::OptimizerSection& config, ParameterStore& store) {
  if (config.type == recipe::OptimizerType::sgd) return std::make_unique<Sgd>(config, store);
  return std::make_unique<AdamW>(config, store);
}

double learning_rate(const recipe::Recipe& recipe, int64_t step) {
  const double peak = recipe.optimizer.lr;
  const auto& s = recipe.scheduler;
  if (step < s.warmup_steps) return peak * double(step + 1) / double(s.warmup_steps);
  if (s.type == recipe::SchedulerType::constant) return peak;
  // Decay over the steps after warmup, reaching min_lr after the last one (as nanoGPT and
  // PyTorch's CosineAnnealingLR do): the last step still learns, and a single step runs at the peak.
  const int64_t decay_steps = recipe.train.steps - s.warmup_steps;
  const double progress = double(step - s.warmup_steps) / double(decay_steps);
  const double factor =
      s.type == recipe::SchedulerType::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return s.min_lr + (peak - s.min_lr) * factor;
}

namespace {

// Per unit, this rank's shard of an optimizer-range buffer (wherever the range starts), in blocks.
// Each block sums its squares in one fixed order (optim/update_math.h block_squares: 16 interleaved
// double lanes added in a fixed tree, which the compiler vectorises and the CUDA kernel repeats; in
// element order each add waited for the last, 14 ms per step for the benchmark GPT's 30M gradients
// on 2 threads), so the partials are the same on any number of threads and ranks and on either
// device; the blocks run in parallel (a serial pass took 0.4 s per step for GPT-2 small's 124M
// gradients).
// `zeroed`: per unit, element ranges of the buffer counted as zeros (nullptr: none); a block that
// meets one is summed from a copy with them zeroed, so the partials are those of the zeroed buffer.
template <class Buffer>
std::vector<double> shard_norm_partials(const ParameterStore& store, Buffer&& buffer,
                                        const std::vector<std::vector<std::pair<int64_t, int64_t>>>* zeroed = nullptr) {
  const ShardLayout& layout = store.layout();
  struct Block {
    const float* x;
    size_t unit;
    int64_t offset;  // of x in the unit's buffer
  };
  std::vector<Block> blocks;
  blocks.reserve(size_t(layout.total_shard() / kShardBlock));
  for (size_t u = 0; u < layout.units(); ++u) {
    const int64_t first = layout.begin(u) - store.range_begin(u);
    for (int64_t block = 0; block < layout.shard(u); block += kShardBlock)
      blocks.push_back({buffer(u) + first + block, u, first + block});
  }
  std::vector<double> partials(blocks.size());
  const auto count = int64_t(blocks.size());
#pragma omp parallel for schedule(static) if (count > 16)
  for (int64_t b = 0; b < count; ++b) {
    const Block& block = blocks[size_t(b)];
    const float* x = block.x;
    alignas(64) float copy[kShardBlock];
    if (zeroed)
      for (auto [lo, hi] : (*zeroed)[block.unit]) {
        const int64_t from = std::max(lo, block.offset), to = std::min(hi, block.offset + kShardBlock);
        if (from >= to) continue;
        if (x != copy) {
          std::copy_n(block.x, kShardBlock, copy);
          x = copy;
        }
        std::fill(copy + (from - block.offset), copy + (to - block.offset), 0.0f);
      }
    partials[size_t(b)] = block_squares(x);
  }
  return partials;
}

}  // namespace

std::vector<double> gradient_norm_partials(const ParameterStore& store, bool whole_weights) {
  if (whole_weights) return shard_norm_partials(store, [&](size_t u) { return store.opt_grad(u); });
  // The whole (replicated) weights' elements of each unit's range count as zeros: a split weight's
  // squares are this rank's alone, a whole one's are counted by one rank of the group.
  const Graph& graph = store.graph();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> zeroed(graph.units().size());
  for (int index = 0; index < int(graph.params().size()); ++index) {
    const Param& p = graph.params()[size_t(index)];
    if (p.slice.split()) continue;
    const auto u = size_t(p.unit);
    const int64_t begin = store.range_begin(u), size = store.range_size(u);
    const int64_t lo = std::max(p.offset, begin), hi = std::min(p.offset + store.numel(index), begin + size);
    if (lo < hi) zeroed[u].emplace_back(lo - begin, hi - begin);
  }
  return shard_norm_partials(
      store, [&](size_t u) { return store.opt_grad(u); }, &zeroed);
}

std::vector<double> master_norm_partials(const ParameterStore& store) {
  return shard_norm_partials(store, [&](size_t u) { return store.master(u); });
}

double sum_norm_partials(const std::vector<double>& partials) {
  const auto n = int64_t(partials.size());
  std::vector<double> chunks(size_t(norm_chunks(n)));
  for (int64_t c = 0; c < int64_t(chunks.size()); ++c) chunks[size_t(c)] = norm_chunk_sum(partials.data(), n, c);
  return std::sqrt(sum_in_order(chunks.data(), int64_t(chunks.size())));
}

void scale_gradients(ParameterStore& store, double factor) {
  const auto scale = float(factor);
  for (size_t u = 0; u < store.graph().units().size(); ++u) {
    float* g = store.opt_grad(u);
    const int64_t n = store.range_size(u);
#pragma omp parallel for simd schedule(static)
    for (int64_t k = 0; k < n; ++k) g[k] *= scale;
  }
}

}  // namespace engine
