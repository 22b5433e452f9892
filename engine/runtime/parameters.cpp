#include "runtime/parameters.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/convert.h"
#include "core/error.h"
#include "core/rng.h"
#include "offload/offloaded_state.h"

namespace engine {

namespace {

// One rank and one micro-batch below stage 2: nothing to sum, the optimizer reads what the backward
// wrote (the single-process path, as fast as it ever was).
bool gradient_alias(const ShardingSpec& spec) { return spec.world == 1 && spec.accumulation == 1 && spec.stage < 2; }

// Values into a parameter copy of type `dtype` (fp32: copied).
void store_copy(const float* values, std::byte* target, DType dtype, int64_t count) {
  if (dtype == DType::f32)
    std::copy_n(values, count, reinterpret_cast<float*>(target));
  else
    narrow(values, target, dtype, count);
}

}  // namespace

ParameterStore::UnitSizes ParameterStore::unit_sizes(const ShardLayout& layout, const ShardingSpec& spec,
                                                     const OffloadSpec& offload, DType param, DType grad, size_t u) {
  const int64_t csize = int64_t(dtype_size(param)), gsize = int64_t(dtype_size(grad));
  const int64_t padded = layout.padded(u), shard = layout.shard(u), range = range_size(layout, spec, u);
  const bool masters_offloaded = offload.masters_offloaded(param, spec.stage);
  UnitSizes s;
  if (spec.stage < 3) s.compute = padded * csize;
  // Else a view into compute; offloaded masters live in the OffloadedState.
  if ((spec.stage == 3 || param != DType::f32) && !masters_offloaded) s.master = range * 4;
  // Stage 3's gathers read a shard copy when the master is not it (16-bit, or offloaded), unless the
  // copy is offloaded too.
  if (spec.stage == 3 && (param != DType::f32 || masters_offloaded) && offload.parameters == OffloadTier::none)
    s.shard16 = shard * csize;
  if (spec.stage < 2) s.micro_grad = padded * gsize;
  if (!gradient_alias(spec)) s.grad_shard = shard * gsize;
  if (grad != DType::f32) s.opt_grad = range * 4;  // else a view into the reduced gradient
  return s;
}

ParameterStore::Bytes ParameterStore::planned_bytes(const Graph& graph, const ShardingSpec& spec,
                                                    const OffloadSpec& offload) {
  const ShardLayout layout(graph.units(), spec.world, 0);
  Bytes bytes;
  for (size_t u = 0; u < layout.units(); ++u) {
    UnitSizes s = unit_sizes(layout, spec, offload, graph.param_dtype(), graph.grad_dtype(), u);
    bytes.parameters += s.compute + s.master + s.shard16;
    bytes.gradients += s.micro_grad + s.grad_shard + s.opt_grad;
    bytes.optimizer_elements += range_size(layout, spec, u);
  }
  if (!graph.frozen().empty())
    bytes.frozen = graph.frozen_count() * int64_t(dtype_size(graph.value(graph.frozen()[0].value).dtype));
  return bytes;
}

ParameterStore::ParameterStore(const Graph& graph, ShardingSpec spec)
    : ParameterStore(graph, spec, OffloadSpec{}, nullptr) {}

ParameterStore::ParameterStore(const Graph& graph, ShardingSpec spec, const OffloadSpec& offload,
                               OffloadedState* offloaded)
    : graph_(graph),
      spec_(spec),
      layout_(graph.units(), spec.world, spec.rank),
      param_dtype_(graph.param_dtype()),
      grad_dtype_(graph.grad_dtype()),
      grad_alias_(gradient_alias(spec)),
      masters_offloaded_(offload.masters_offloaded(param_dtype_, spec.stage)),
      shard_offloaded_(spec.stage == 3 && offload.parameters != OffloadTier::none),
      offloaded_(offloaded) {
  ENGINE_CHECK(!(masters_offloaded_ || shard_offloaded_) || offloaded, "offloaded state needs its store");
  units_.resize(graph_.units().size());
  // Each buffer on pages of its own: a GPU run registers them with the driver one by one
  // (page-locked for its copies), and the driver refuses a page that is already registered.
  const auto block = [](int64_t bytes) { return Buffer(bytes, bytes > 0 ? 4096 : Buffer::kDefaultAlignment); };
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitSizes sizes = unit_sizes(layout_, spec_, offload, param_dtype_, grad_dtype_, u);
    UnitBuffers& b = units_[u];
    b.compute = block(sizes.compute);
    b.master = block(sizes.master);
    b.shard16 = block(sizes.shard16);
    b.micro_grad = block(sizes.micro_grad);
    b.grad_shard = block(sizes.grad_shard);
    b.opt_grad = block(sizes.opt_grad);
    b.master_ptr = sizes.master ? b.master.f32() : masters_offloaded_ ? nullptr : b.compute.f32() + range_begin(u);
    b.grad_shard_ptr = grad_alias_ ? b.micro_grad.data() : b.grad_shard.data();
    b.opt_grad_ptr = sizes.opt_grad ? b.opt_grad.f32() : reinterpret_cast<float*>(reduced_grad(u));
  }
  if (!graph_.frozen().empty()) {
    frozen_dtype_ = graph_.value(graph_.frozen()[0].value).dtype;
    frozen_ = Buffer(graph_.frozen_count() * int64_t(dtype_size(frozen_dtype_)));
  }
}

void* ParameterStore::frozen_storage(int index) const {
  return frozen_.data() + graph_.frozen()[size_t(index)].offset * int64_t(dtype_size(frozen_dtype_));
}

std::string ParameterStore::hash_text(uint64_t hash) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string ParameterStore::frozen_digest() const {
  return hash_text(XXH3_64bits(frozen_.data(), size_t(frozen_.bytes())));
}

uint64_t ParameterStore::frozen_hash(const std::set<std::string>& skip, int64_t* elements) const {
  constexpr int64_t kChunk = 4096;  // widened a chunk at a time: no whole fp32 copy of a weight
  uint64_t sum = 0;
  int64_t hashed = 0;
  for (int index = 0; index < int(graph_.frozen().size()); ++index) {
    const Param& p = graph_.frozen()[size_t(index)];
    if (skip.count(p.name)) continue;
    const uint64_t name = XXH3_64bits(p.name.data(), p.name.size());
    const int64_t n = frozen_numel(index);
    const auto* stored = static_cast<const std::byte*>(frozen_storage(index));
    const int64_t element_bytes = int64_t(dtype_size(frozen_dtype_));
    // The index of each element in the whole tensor: a slice's rows and columns are the whole's.
    const bool split = p.slice.split();
    const std::vector<int64_t> rows = split ? p.slice.row_list() : std::vector<int64_t>{};
    const int64_t width = split ? p.slice.columns() : n, stride = split ? p.slice.logical_columns() : n,
                  column = split ? p.slice.column_begin() : 0;
    uint64_t partial = 0;
#pragma omp parallel for reduction(+ : partial) schedule(static)
    for (int64_t first = 0; first < n; first += kChunk) {
      const int64_t count = std::min(kChunk, n - first);
      float values[kChunk];
      widen_serial(stored + first * element_bytes, frozen_dtype_, values, count);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t at = first + k, whole = split ? rows[size_t(at / width)] * stride + column + at % width : at;
        uint32_t bits;
        std::memcpy(&bits, &values[k], sizeof bits);
        partial += mix64(mix64(name + uint64_t(whole)) ^ bits);
      }
    }
    sum += partial;
    hashed += n;
  }
  if (elements) *elements = hashed;
  return sum;
}

void ParameterStore::set_frozen_part(int index, int64_t first, const float* values, int64_t count) {
  store_copy(values, static_cast<std::byte*>(frozen_storage(index)) + first * int64_t(dtype_size(frozen_dtype_)),
             frozen_dtype_, count);
}

std::vector<float> ParameterStore::frozen_values(int index) const {
  const int64_t n = graph_.value(graph_.frozen()[size_t(index)].value).shape.numel();
  std::vector<float> values(static_cast<size_t>(n));
  widen(frozen_storage(index), frozen_dtype_, values.data(), n);
  return values;
}

std::byte* ParameterStore::reduced_grad(size_t unit) const {
  return spec_.stage == 0 && spec_.world > 1 ? units_[unit].micro_grad.data() : units_[unit].grad_shard_ptr;
}

const std::byte* ParameterStore::gather_source(size_t unit) const {
  const UnitBuffers& b = units_[unit];
  return b.shard16.bytes() ? b.shard16.data() : reinterpret_cast<const std::byte*>(b.master_ptr);
}

void* ParameterStore::param_storage(int index) const {
  if (spec_.stage == 3) return nullptr;
  const Param& p = graph_.params()[size_t(index)];
  return units_[size_t(p.unit)].compute.data() + p.offset * int64_t(dtype_size(param_dtype_));
}

void* ParameterStore::grad_storage(int index) const {
  if (spec_.stage >= 2) return nullptr;
  const Param& p = graph_.params()[size_t(index)];
  return units_[size_t(p.unit)].micro_grad.data() + p.offset * int64_t(dtype_size(grad_dtype_));
}

float* ParameterStore::param(int index) const {
  ENGINE_CHECK(masters_whole(), "the whole fp32 masters exist only at ZeRO stage 0 or on one rank");
  const Param& p = graph_.params()[size_t(index)];
  return units_[size_t(p.unit)].master_ptr + p.offset;
}

float* ParameterStore::grad(int index) const {
  ENGINE_CHECK(masters_whole(), "the whole gradient exists only at ZeRO stage 0 or on one rank");
  const Param& p = graph_.params()[size_t(index)];
  return units_[size_t(p.unit)].opt_grad_ptr + p.offset;
}

std::pair<int64_t, int64_t> ParameterStore::drawn_part(Graph::WeightRef ref, int64_t first, int64_t count,
                                                       bool shards) const {
  if (ref.frozen || !shards) return {0, count};  // frozen weights stay whole on every rank
  const Param& p = graph_.params()[size_t(ref.index)];
  const auto u = size_t(p.unit);
  const int64_t at = p.offset + first;
  const int64_t lo = std::clamp(layout_.begin(u) - at, int64_t(0), count);
  return {lo, std::clamp(layout_.begin(u) + layout_.shard(u) - at, lo, count)};
}

void ParameterStore::set_param_part(int index, int64_t first, const float* values, int64_t count) {
  const Param& p = graph_.params()[size_t(index)];
  const auto u = size_t(p.unit);
  UnitBuffers& b = units_[u];
  const int64_t at = p.offset + first;  // the part's first element in the unit's buffer
  if (spec_.stage < 3) {
    if (param_dtype_ == DType::f32)
      std::copy_n(values, count, b.compute.f32() + at);
    else
      narrow(values, b.compute.data() + at * 2, param_dtype_, count);
  }
  const int64_t begin = std::max(at, range_begin(u));
  const int64_t end = std::min(at + count, range_begin(u) + range_size(u));
  if (begin >= end) return;
  const float* part = values + (begin - at);
  const int64_t in_range = begin - range_begin(u), n = end - begin;
  if (masters_offloaded_)
    offloaded_->write(offloaded_->kind("master"), u, in_range, n, part);
  else
    std::copy_n(part, n, b.master_ptr + in_range);
  if (spec_.stage != 3) return;
  const int64_t csize = int64_t(dtype_size(param_dtype_));
  if (shard_offloaded_) {
    std::vector<std::byte> copy(size_t(n * csize));
    store_copy(part, copy.data(), param_dtype_, n);
    offloaded_->params()->write((offloaded_->unit_base(u) + in_range) * csize, n * csize, copy.data());
  } else if (b.shard16.bytes()) {
    store_copy(part, b.shard16.data() + in_range * csize, param_dtype_, n);
  }
}

void ParameterStore::refresh_copies() {
  if (masters_offloaded_) {
    // The masters stream through memory once; the copies are written from each chunk.
    offloaded_->update(
        [&](const OffloadedState::Chunk& c) {
          write_copies(c.first, c.count, c.kinds[offloaded_->kind("master")],
                       shard_offloaded_ ? offloaded_->params()->put(c.index) : nullptr);
          if (shard_offloaded_) offloaded_->params()->commit(c.index);
        },
        false);
    if (shard_offloaded_) offloaded_->params()->wait();
    return;
  }
  if (shard_offloaded_) {
    offloaded_->for_each_chunk([&](const OffloadedState::Chunk& c) {
      write_copies(c.first, c.count, nullptr, offloaded_->params()->put(c.index));
      offloaded_->params()->commit(c.index);
    });
    offloaded_->params()->wait();
    return;
  }
  if (param_dtype_ == DType::f32) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitBuffers& b = units_[u];
    std::byte* target = spec_.stage == 3 ? b.shard16.data() : b.compute.data() + range_begin(u) * 2;
    narrow(b.master_ptr, target, param_dtype_, range_size(u));
  }
}

void ParameterStore::write_copies(int64_t first, int64_t count, const float* masters, std::byte* shard_chunk) {
  if (spec_.stage < 3 && param_dtype_ == DType::f32) return;  // the masters are the parameters
  const int64_t csize = int64_t(dtype_size(param_dtype_));
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t base = offloaded_->unit_base(u);
    const int64_t lo = std::max(first, base), hi = std::min(first + count, base + range_size(u));
    if (lo >= hi) continue;
    const float* source = masters ? masters + (lo - first) : units_[u].master_ptr + (lo - base);
    std::byte* target = shard_chunk        ? shard_chunk + (lo - first) * csize
                        : spec_.stage == 3 ? units_[u].shard16.data() + (lo - base) * csize
                                           : units_[u].compute.data() + (range_begin(u) + lo - base) * csize;
    store_copy(source, target, param_dtype_, hi - lo);
  }
}

void ParameterStore::widen_gradients() {
  if (grad_dtype_ == DType::f32) return;
  for (size_t u = 0; u < units_.size(); ++u) widen(reduced_grad(u), grad_dtype_, units_[u].opt_grad_ptr, range_size(u));
}

void ParameterStore::retype(DType from, DType to) {
  if (param_dtype_ == from) param_dtype_ = to;
  if (offloaded_ && offloaded_->param_dtype() == from) offloaded_->retype_params(to);
  if (grad_dtype_ == from) grad_dtype_ = to;
  if (frozen_dtype_ == from && frozen_.bytes()) {  // rounded again from the values they hold
    const int64_t n = graph_.frozen_count();
    std::vector<float> values(static_cast<size_t>(n));
    widen(frozen_.data(), from, values.data(), n);
    narrow(values.data(), frozen_.data(), to, n);
    frozen_dtype_ = to;
  }
  refresh_copies();
}

void ParameterStore::initialize(uint64_t seed, bool own_shard_only) {
  // One init stream, drawn in declaration order. Each normal takes four words of it (two 53-bit
  // uniforms), so draw j of a part starts at word position + 4 j: the stream is counter-based, and
  // threads fill blocks of a part from their own positions with the sequential stream's values.
  // Uniforms (adapters) take two words of their own stream. In parts, so that initialising a
  // sharded model never holds a whole large parameter.
  constexpr int64_t kPart = int64_t(1) << 20, kBlock = int64_t(1) << 14;
  std::vector<float> values(static_cast<size_t>(kPart));
  uint64_t position = 0, uniform_position = 0;
  const bool shards = shards_drawn(own_shard_only);
  for (const Graph::WeightRef ref : graph_.weights()) {
    const Param& p = graph_.weight(ref);
    const int64_t n = graph_.value(p.value).shape.numel();
    uint64_t& at = p.init.kind == ParamInit::Kind::uniform ? uniform_position : position;
    // A pipeline stage's weight draws where the whole model's does; the stream goes on from there.
    if (p.init_position >= 0) at = uint64_t(p.init_position);
    if (p.slice.split()) {  // this rank's part of a tensor-parallel weight, drawn where the whole one is
      at = initialize_slice(ref, seed, at);
      continue;
    }
    for (int64_t first = 0; first < n; first += kPart) {
      const int64_t count = std::min(kPart, n - first);
      const auto scale = float(p.init.std);
      if (p.init.kind == ParamInit::Kind::normal) {
        // Where shards are drawn, only the values in this rank's shard: 1/world of the whole
        // model's draws per rank. Elsewhere `values` holds what an earlier part left, which stage 3
        // does not keep (set_param_part) and the gather of stages 0-2 overwrites.
        // Plain locals, not a structured binding: clang 14 cannot capture bindings into an OpenMP region.
        const auto drawn = drawn_part(ref, first, count, shards);
        const int64_t lo = drawn.first, hi = drawn.second;
#pragma omp parallel for schedule(static)
        for (int64_t block = 0; block < (hi - lo + kBlock - 1) / kBlock; ++block) {
          const int64_t begin = lo + block * kBlock;
          RandomStream stream(seed, RandomPurpose::init, position + 4 * uint64_t(begin));
          for (int64_t k = begin; k < std::min(hi, begin + kBlock); ++k) values[size_t(k)] = scale * stream.normal();
        }
        position += 4 * uint64_t(count);
      } else if (p.init.kind == ParamInit::Kind::uniform) {
        RandomStream stream(seed, RandomPurpose::adapter_init, uniform_position);
        for (int64_t k = 0; k < count; ++k) values[size_t(k)] = scale * float(2.0 * stream.uniform() - 1.0);
        uniform_position = stream.position();
      } else {
        std::fill_n(values.begin(), count, p.init.kind == ParamInit::Kind::ones ? 1.0f : 0.0f);
      }
      if (ref.frozen)
        set_frozen_part(ref.index, first, values.data(), count);
      else
        set_param_part(ref.index, first, values.data(), count);
    }
  }
}

uint64_t ParameterStore::initialize_slice(Graph::WeightRef ref, uint64_t seed, uint64_t position) {
  const Param& p = graph_.weight(ref);
  const TensorSlice& slice = p.slice;
  const int64_t logical = slice.logical.numel(), n = graph_.value(p.value).shape.numel();
  const int64_t columns = slice.logical_columns(), width = slice.columns(), column_begin = slice.column_begin();
  const int64_t local_rows = n / width;
  const std::vector<int64_t> logical_rows = slice.row_list();
  std::vector<float> values(static_cast<size_t>(n));
  const auto scale = float(p.init.std);
  if (p.init.kind == ParamInit::Kind::normal) {  // four words a draw
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < local_rows; ++r) {
      RandomStream stream(seed, RandomPurpose::init,
                          position + 4 * uint64_t(logical_rows[size_t(r)] * columns + column_begin));
      for (int64_t k = 0; k < width; ++k) values[size_t(r * width + k)] = scale * stream.normal();
    }
    position += 4 * uint64_t(logical);
  } else if (p.init.kind == ParamInit::Kind::uniform) {  // two words a draw, from the adapters' stream
    for (int64_t r = 0; r < local_rows; ++r) {
      RandomStream stream(seed, RandomPurpose::adapter_init,
                          position + 2 * uint64_t(logical_rows[size_t(r)] * columns + column_begin));
      for (int64_t k = 0; k < width; ++k) values[size_t(r * width + k)] = scale * float(2.0 * stream.uniform() - 1.0);
    }
    position += 2 * uint64_t(logical);
  } else {
    std::fill(values.begin(), values.end(), p.init.kind == ParamInit::Kind::ones ? 1.0f : 0.0f);
  }
  set_weight(ref, values.data());
  return position;
}

void ParameterStore::zero_micro_grads() {
  for (UnitBuffers& b : units_) b.micro_grad.zero();
}

}  // namespace engine
