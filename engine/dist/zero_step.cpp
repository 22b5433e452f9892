#include "dist/zero_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "offload/offloaded_state.h"
#include "optim/optimizer.h"

namespace engine {

namespace {

std::string unit_label(const ParameterStore& store, int unit) {
  return "unit " + store.graph().units()[size_t(unit)].name;
}

}  // namespace

WholeParameters::WholeParameters(const ParameterStore& store, Communicator& comm) : store_(store) {
  if (store.masters_whole()) return;
  const ShardLayout& layout = store.layout();
  std::vector<Buffer> shards;  // offloaded masters: this rank's, read for the gather
  std::vector<Work> works;
  for (size_t u = 0; u < layout.units(); ++u) {
    gathered_.emplace_back(layout.padded(u) * 4);
    const float* mine = store.master(u);
    if (store.masters_offloaded()) {
      shards.emplace_back(layout.shard(u) * 4);
      store.offloaded()->read(store.offloaded()->kind("master"), u, 0, layout.shard(u), shards.back().f32());
      mine = shards.back().f32();
    }
    works.push_back(comm.all_gather(mine, gathered_.back().data(), layout.shard(u) * 4,
                                    "all-gather of " + unit_label(store, int(u)) + "'s weights"));
  }
  for (Work& w : works) w.wait();
}

const float* WholeParameters::param(int index) const {
  const Param& p = store_.graph().params()[size_t(index)];
  if (!gathered_.empty()) return gathered_[size_t(p.unit)].f32() + p.offset;
  if (!store_.masters_offloaded()) return store_.param(index);
  if (unit_index_ != p.unit) {
    const auto u = size_t(p.unit);
    unit_ = Buffer(store_.range_size(u) * 4);
    store_.offloaded()->read(store_.offloaded()->kind("master"), u, 0, store_.range_size(u), unit_.f32());
    unit_index_ = p.unit;
  }
  return unit_.f32() + (p.offset - store_.range_begin(size_t(p.unit)));
}

std::vector<int> gather_sequence(const Plan& plan) {
  std::vector<int> units;
  for (const auto& list : plan.actions)
    for (const StepAction& a : list)
      if (a.kind == StepAction::Kind::gather) units.push_back(a.unit);
  return units;
}

void ZeroStep::begin_pass(const std::vector<int>& gathers) {
  if (!store_.shard_offloaded()) return;
  ChunkStore& shard = *store_.offloaded()->params();
  if (slots_ == 0) {
    slots_ = fetch_slots(prefetch_);
    int64_t largest = 0;
    for (size_t u = 0; u < store_.layout().units(); ++u)
      largest = std::max(largest, store_.offloaded()->param_bytes(store_.layout().shard(u)));
    shard.reserve_fetch_slots(slots_, largest);
  }
  sequence_ = gathers;
  position_ = fetched_ = 0;
  if (!sequence_.empty()) fetch(0);
}

void ZeroStep::fetch(size_t gather) {
  const auto u = size_t(sequence_[gather]);
  OffloadedState& state = *store_.offloaded();
  state.params()->fetch(int(gather % size_t(slots_)), state.param_bytes(state.unit_base(u)),
                        state.param_bytes(store_.layout().shard(u)));
  fetched_ = gather + 1;
}

const std::byte* ZeroStep::fetched_source(int unit) {
  ENGINE_CHECK(position_ < sequence_.size() && sequence_[position_] == unit,
               "a gather the plan did not announce (begin_pass)");
  if (fetched_ <= position_) fetch(position_);
  if (position_ + 1 < sequence_.size() && fetched_ <= position_ + 1) fetch(position_ + 1);
  return store_.offloaded()->params()->view(int(position_++ % size_t(slots_)));
}

void ZeroStep::run(const StepAction& action, std::byte* buffer) {
  const auto u = size_t(action.unit);
  const ShardLayout& layout = store_.layout();
  switch (action.kind) {
    case StepAction::Kind::gather: {
      const int64_t bytes = layout.shard(u) * int64_t(dtype_size(store_.param_dtype()));
      const std::byte* source = store_.shard_offloaded() ? fetched_source(action.unit) : store_.gather_source(u);
      gathers_[action.buffer] =
          comm_.all_gather(source, buffer, bytes, "all-gather of " + unit_label(store_, action.unit) + "'s parameters");
      break;
    }
    case StepAction::Kind::use_params: {
      auto it = gathers_.find(action.buffer);
      ENGINE_CHECK(it != gathers_.end(), "a gather is used before it was started");
      it->second.wait();
      gathers_.erase(it);
      break;
    }
    case StepAction::Kind::reduce: {
      const std::byte* send = buffer ? buffer : store_.micro_grad(u);
      reductions_[action.unit] =
          comm_.reduce_scatter(send, store_.grad_shard(u), layout.shard(u), store_.grad_dtype(),
                               first_micro_ ? Reduction::overwrite : Reduction::accumulate,
                               "reduce-scatter of " + unit_label(store_, action.unit) + "'s gradients");
      break;
    }
    case StepAction::Kind::wait: {
      auto it = reductions_.find(action.unit);
      ENGINE_CHECK(it != reductions_.end(), "a reduction is waited for before it was started");
      it->second.wait();
      reductions_.erase(it);
      break;
    }
    case StepAction::Kind::grads_into:
      break;  // the executor binds the buffer
  }
}

void ZeroStep::finish_gradients() {
  const ShardLayout& layout = store_.layout();
  if (store_.sharding().stage == 0 && layout.world() > 1) {
    // Stage 0 keeps the whole gradient: the reduced shards are gathered back into it.
    const int64_t element = int64_t(dtype_size(store_.grad_dtype()));
    std::vector<Work> works;
    for (size_t u = 0; u < layout.units(); ++u) {
      std::byte* whole = store_.micro_grad(u);
      std::byte* mine = whole + layout.begin(u) * element;
      std::memcpy(mine, store_.grad_shard(u), size_t(layout.shard(u) * element));
      works.push_back(comm_.all_gather(mine, whole, layout.shard(u) * element,
                                       "all-gather of " + unit_label(store_, int(u)) + "'s reduced gradients"));
    }
    for (Work& w : works) w.wait();
  }
  store_.widen_gradients();
}

namespace {

// Per unit, the square root of the sum of its blocks' partial sums: `blocks(u)` of them each, one
// unit after another.
template <class Blocks>
std::vector<double> unit_norms(const ShardLayout& layout, const std::vector<double>& ordered, Blocks blocks) {
  std::vector<double> norms;
  size_t at = 0;
  for (size_t u = 0; u < layout.units(); ++u) {
    const auto count = size_t(blocks(u));
    double sum = 0;
    for (size_t k = 0; k < count; ++k) sum += ordered[at + k];
    norms.push_back(std::sqrt(sum));
    at += count;
  }
  return norms;
}
// ... of a list of every unit's padded blocks (unit, rank, block), or of their value blocks alone.
std::vector<double> padded_unit_norms(const ShardLayout& layout, const std::vector<double>& ordered) {
  return unit_norms(layout, ordered, [&](size_t u) { return layout.padded(u) / kShardBlock; });
}
std::vector<double> value_unit_norms(const ShardLayout& layout, const std::vector<double>& ordered) {
  return unit_norms(layout, ordered, [&](size_t u) { return layout.value_blocks(u); });
}

}  // namespace

std::vector<double> without_padding_blocks(const ShardLayout& layout, const std::vector<double>& unit_major) {
  std::vector<double> values;
  size_t at = 0;
  for (size_t u = 0; u < layout.units(); ++u) {
    const auto blocks = size_t(layout.padded(u) / kShardBlock);
    ENGINE_CHECK(at + blocks <= unit_major.size(), "a partial-sum list shorter than the layout's blocks");
    values.insert(values.end(), unit_major.begin() + long(at),
                  unit_major.begin() + long(at + size_t(layout.value_blocks(u))));
    at += blocks;
  }
  ENGINE_CHECK(at == unit_major.size(), "a partial-sum list longer than the layout's blocks");
  return values;
}

std::vector<double> ZeroStep::rank_major_to_unit_major(const std::vector<double>& all, size_t per_rank) const {
  const ShardLayout& layout = store_.layout();
  const auto world = size_t(layout.world());
  // Rank-major as gathered; norms sum unit-major (unit, rank, block), the order of one rank.
  std::vector<double> ordered;
  ordered.reserve(all.size());
  size_t unit_start = 0;
  for (size_t u = 0; u < layout.units(); ++u) {
    const auto blocks = size_t(layout.shard(u) / kShardBlock);
    for (size_t r = 0; r < world; ++r)
      ordered.insert(ordered.end(), all.begin() + long(r * per_rank + unit_start),
                     all.begin() + long(r * per_rank + unit_start + blocks));
    unit_start += blocks;
  }
  return ordered;
}

double ZeroStep::gradient_norm() {
  return gradient_norm(gradient_norm_partials(store_, !tensor_ || tensor_->rank() == 0));
}

double ZeroStep::gradient_norm(std::vector<double> partials) {
  const ShardLayout& layout = store_.layout();
  if (tensor_) {  // the group's partials summed in rank order: the same list on every rank of it
    const std::vector<double> all =
        gather_values(*tensor_, partials, "the gradient norm's tensor-parallel partial sums");
    for (size_t k = 0; k < partials.size(); ++k) {
      partials[k] = 0;
      for (int r = 0; r < tensor_->size(); ++r) partials[k] += all[size_t(r) * partials.size() + k];
    }
  }
  if (layout.world() > 1)
    partials = rank_major_to_unit_major(gather(partials, "the gradient norm's partial sums"), partials.size());
  partials = without_padding_blocks(layout, partials);
  unit_gradient_norms_ = value_unit_norms(layout, partials);
  if (!pipeline_) return sum_norm_partials(partials);
  // Every stage's partial sums over the units it counts, in stage order: the whole model's list in
  // its order (its units are the stages' in turn), so the norm is one process's bits.
  std::vector<double> counted;
  size_t at = 0;
  for (size_t u = 0; u < layout.units(); ++u) {
    const auto blocks = size_t(layout.value_blocks(u));
    if (counted_units_[u])
      counted.insert(counted.end(), partials.begin() + long(at), partials.begin() + long(at + blocks));
    at += blocks;
  }
  // Stages hold different units: each list is padded to the longest for the gather.
  const std::vector<double> sizes =
      gather_values(*pipeline_, {double(counted.size())}, "the stages' gradient norm sizes");
  const auto longest = size_t(*std::max_element(sizes.begin(), sizes.end()));
  counted.resize(longest, 0.0);
  const std::vector<double> all = gather_values(*pipeline_, counted, "the stages' gradient norm partial sums");
  std::vector<double> model;
  for (size_t s = 0; s < sizes.size(); ++s)
    model.insert(model.end(), all.begin() + long(s * longest), all.begin() + long(s * longest + size_t(sizes[s])));
  return sum_norm_partials(model);
}

double ZeroStep::whole_gradient_norm(const std::vector<double>& partials) {
  ENGINE_CHECK(!tensor_ && !pipeline_, "whole partial sums cover one replica's whole model");
  unit_gradient_norms_ = value_unit_norms(store_.layout(), partials);
  return sum_norm_partials(partials);
}

std::vector<double> ZeroStep::whole_unit_parameter_norms(const std::vector<double>& partials) {
  return value_unit_norms(store_.layout(), partials);
}

std::vector<double> ZeroStep::unit_parameter_norms() {
  const ShardLayout& layout = store_.layout();
  for (size_t u = 0; u < layout.units(); ++u)
    if (!store_.master(u)) return {};
  return unit_parameter_norms(master_norm_partials(store_));
}

std::vector<double> ZeroStep::unit_parameter_norms(std::vector<double> partials) {
  const ShardLayout& layout = store_.layout();
  if (layout.world() > 1)
    partials = rank_major_to_unit_major(gather(partials, "the parameter norms' partial sums"), partials.size());
  return padded_unit_norms(layout, partials);
}

void ZeroStep::finish_update(bool refresh) {
  if (refresh) store_.refresh_copies();
  gather_parameters();
}

void ZeroStep::gather_parameters() {
  const int stage = store_.sharding().stage;
  if (store_.layout().world() == 1 || stage == 0 || stage == 3) return;
  gather_whole_units([&](size_t u) { return store_.compute(u); }, int64_t(dtype_size(store_.param_dtype())),
                     "updated parameters");
}

void ZeroStep::gather_whole_units(const std::function<std::byte*(size_t)>& whole, int64_t element,
                                  const std::string& what) {
  const ShardLayout& layout = store_.layout();
  std::vector<Work> works;
  for (size_t u = 0; u < layout.units(); ++u) {
    std::byte* unit = whole(u);
    if (!unit) continue;
    works.push_back(comm_.all_gather(unit + layout.begin(u) * element, unit, layout.shard(u) * element,
                                     "all-gather of " + unit_label(store_, int(u)) + "'s " + what));
  }
  for (Work& w : works) w.wait();
}

void ZeroStep::gather_drawn_shards() {
  if (store_.sharding().stage == 3 || !store_.shards_drawn(true)) return;
  gather_whole_units([&](size_t u) { return store_.compute(u); }, int64_t(dtype_size(store_.param_dtype())),
                     "initial weights");
  if (store_.sharding().stage != 0) return;
  // Stage 0's masters are whole too; in fp32 they are the compute values just gathered.
  gather_whole_units(
      [&](size_t u) {
        auto* masters = reinterpret_cast<std::byte*>(store_.master(u));
        return masters == store_.compute(u) ? nullptr : masters;
      },
      4, "initial weights");
}

double ZeroStep::mean_loss(const std::vector<double>& local_losses) {
  const auto world = size_t(comm_.size()), micro = local_losses.size();
  const std::vector<double> all = gather(local_losses, "the step's losses");
  double loss = 0;
  for (size_t m = 0; m < micro; ++m)
    for (size_t r = 0; r < world; ++r) loss += all[r * micro + m] / double(world * micro);
  return loss;
}

std::vector<double> ZeroStep::gather(const std::vector<double>& values, const std::string& what) {
  return gather_values(comm_, values, what);
}

}  // namespace engine
