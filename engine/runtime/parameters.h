// ParameterStore: the model's parameters, gradients and their fp32 masters, one flat buffer per wrap
// unit each, laid out as the graph's Param offsets say and padded as the ShardLayout says. Units are
// what ZeRO gathers and releases together and what offload moves together.
//
//   ParameterStore store(graph, ShardingSpec{.world = 2, .rank = 1, .stage = 1});
//   store.initialize(seed);        // GPT-2 style: normal(std) weights, zero biases, unit norms
//   float* w = store.param(index); // the full fp32 master of Param `index` (stage 0 or one rank)
//
// Per unit (P: padded elements, S = P / world: this rank's shard at offset begin(u)):
//   compute     (P) what the kernels read, in the compute dtype; stages 0-2. At stage 3 every use
//               gathers the unit into the activation arena instead (the ZeRO plan binds it).
//   master      fp32 masters over the optimizer range: all P at stage 0, the shard S at stages 1-3.
//               In fp32 at stages 0-2 it is a view into `compute`.
//   micro_grad  (P) one micro-batch's gradient as the backward writes it, in the gradient dtype;
//               stages 0-1 (at stages 2-3 the backward writes into arena buffers).
//   grad_shard  (S) the sum over micro-batches and ranks of this rank's shard, in the gradient
//               dtype (a view of micro_grad when there is nothing to sum: one rank, one micro-batch).
//   opt_grad    fp32 gradient over the optimizer range, what clipping and the optimizer read.
// In 16-bit precision, refresh_copies() rounds the masters into the 16-bit compute values (or, at
// stage 3, into a 16-bit shard that the gathers read) after each update.
//
// Frozen weights (Graph::frozen, LoRA's base model) sit in one more buffer, whole on every rank in
// the compute dtype: no master, no gradient, no optimizer state, never sharded or offloaded.
//
// With offload (offload/offloaded_state.h) the masters that are separate from the parameters live in
// the OffloadedState with the optimizer state (master() is null), and at stage 3 the shard the
// gathers read may live there too; the offloaded optimizer writes the copies as it streams.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "dist/shard_layout.h"
#include "graph/graph.h"
#include "offload/offload_spec.h"

namespace engine {

struct ShardingSpec {
  int world = 1;
  int rank = 0;
  int stage = 0;             // ZeRO stage 0-3
  int64_t accumulation = 1;  // micro-batches per optimizer step on each rank
};

class ParameterStore {
 public:
  explicit ParameterStore(const Graph& graph, ShardingSpec spec = {});
  // With offloaded state: `offloaded` holds the masters (kind "master") when masters_offloaded() and
  // the parameter shard when shard_offloaded(); it outlives the store.
  ParameterStore(const Graph& graph, ShardingSpec spec, const OffloadSpec& offload, class OffloadedState* offloaded);

  // What a store for `graph` at `spec` allocates on one rank (what `engine plan` prints).
  struct Bytes {
    int64_t parameters = 0, gradients = 0;
    int64_t frozen = 0;              // the frozen weights, in the compute dtype
    int64_t optimizer_elements = 0;  // what this rank updates: the optimizer state's size in elements
  };
  static Bytes planned_bytes(const Graph& graph, const ShardingSpec& spec, const OffloadSpec& offload = {});

  // Fills every parameter and frozen weight from its ParamInit, drawing normals in declaration
  // order from the seed's init stream: the same seed gives the same model at every world size and
  // stage, and the same base model with or without LoRA adapters.
  // At stage 3 a rank draws only its shard of each trained weight (it keeps nothing else). With
  // `own_shard_only`, so does a rank of several at stages 0-2 where shards_drawn() says so: the rest
  // of its compute values (and of stage 0's separate masters) is then undefined until every rank
  // calls ZeroStep::gather_drawn_shards(). Session::initialize does both: 1/world of the draws.
  void initialize(uint64_t seed, bool own_shard_only = false);
  // Whether initialize(seed, own_shard_only) draws only this rank's shard of the trained weights:
  // several ranks at stage 3, or with own_shard_only at stages 0-2, except stage 0 with offloaded
  // masters (whole on every rank, and nothing gathers them).
  bool shards_drawn(bool own_shard_only) const {
    return spec_.world > 1 && (spec_.stage == 3 || (own_shard_only && !(spec_.stage == 0 && masters_offloaded_)));
  }
  // Frozen weight `index` (Graph::frozen) from its full fp32 values, rounded to the compute dtype;
  // and back, widened to fp32.
  void set_frozen(int index, const float* values) { set_frozen_part(index, 0, values, frozen_numel(index)); }
  void set_frozen_part(int index, int64_t first, const float* values, int64_t count);
  int64_t frozen_numel(int index) const { return graph_.value(graph_.frozen()[size_t(index)].value).shape.numel(); }
  std::vector<float> frozen_values(int index) const;
  void* frozen_storage(int index) const;
  // XXH3 of every frozen weight as stored, in hex: what a LoRA checkpoint recorded of its base
  // before checkpoints named it by frozen_hash.
  std::string frozen_digest() const;
  // What a LoRA checkpoint records of its base, whatever the layout: the sum (mod 2^64) over this
  // rank's frozen elements of a hash of (weight name, the element's index in the whole tensor, its
  // value), leaving out the weights `skip` names. Ranks that hold disjoint parts of the model (tensor
  // slices, pipeline stages) add theirs to the whole model's. `elements`: how many were hashed.
  uint64_t frozen_hash(const std::set<std::string>& skip, int64_t* elements) const;
  static std::string hash_text(uint64_t hash);  // 16 hex digits
  // Either kind of weight, by its place in Graph::weights.
  void set_weight(Graph::WeightRef ref, const float* values) {
    ref.frozen ? set_frozen(ref.index, values) : set_param(ref.index, values);
  }
  // Sets Param `index` from its full fp32 values (every rank passes the same values), or elements
  // [first, first + count) of it.
  void set_param(int index, const float* values) { set_param_part(index, 0, values, numel(index)); }
  void set_param_part(int index, int64_t first, const float* values, int64_t count);
  void zero_micro_grads();  // stages 0-1: before each micro-batch's backward

  // Whole-model views, for one rank or stage 0 (ENGINE_CHECK otherwise):
  float* param(int index) const;  // the fp32 master
  float* grad(int index) const;   // the fp32 gradient the optimizer reads
  bool masters_whole() const { return spec_.world == 1 || spec_.stage == 0; }

  // What the graph's parameter and gradient values point at (null where the ZeRO plan binds them).
  void* param_storage(int index) const;
  void* grad_storage(int index) const;
  DType param_dtype() const { return param_dtype_; }
  DType grad_dtype() const { return grad_dtype_; }

  // Per unit, over the optimizer range [range_begin(u), range_begin(u) + range_size(u)):
  int64_t range_begin(size_t unit) const { return spec_.stage == 0 ? 0 : layout_.begin(unit); }
  int64_t range_size(size_t unit) const { return range_size(layout_, spec_, unit); }
  // The same for any rank of `spec` before a store exists: the whole unit at stage 0, the rank's
  // shard at stages 1-3.
  static int64_t range_size(const ShardLayout& layout, const ShardingSpec& spec, size_t u) {
    return spec.stage == 0 ? layout.padded(u) : layout.shard(u);
  }
  float* master(size_t unit) const { return units_[unit].master_ptr; }  // null when offloaded
  bool masters_offloaded() const { return masters_offloaded_; }
  bool shard_offloaded() const { return shard_offloaded_; }
  class OffloadedState* offloaded() const {
    return offloaded_;
  }
  // Stage 3: the compute-dtype shard the gathers read, when it is separate from the master.
  std::byte* shard_copy(size_t unit) const { return units_[unit].shard16.data(); }
  float* opt_grad(size_t unit) const { return units_[unit].opt_grad_ptr; }
  // The whole unit in the compute dtype (stages 0-2), the gather source of stage 3 (its shard).
  std::byte* compute(size_t unit) const { return units_[unit].compute.data(); }
  const std::byte* gather_source(size_t unit) const;
  std::byte* micro_grad(size_t unit) const { return units_[unit].micro_grad.data(); }
  std::byte* grad_shard(size_t unit) const { return units_[unit].grad_shard_ptr; }
  // The reduced gradient over the optimizer range in the gradient dtype: grad_shard, or at stage 0
  // micro_grad once the shards are gathered into it.
  std::byte* reduced_grad(size_t unit) const;
  bool grad_shard_is_micro_grad() const { return grad_alias_; }

  // Rounds the fp32 masters into the 16-bit compute values or shard (after initialisation,
  // loading and each update; at stages 1-2 the caller then all-gathers `compute`).
  void refresh_copies();
  // The copies of elements [first, first + count) of the flat optimizer run (offloaded_state.h), from
  // `masters` (that run's masters) or, when null, from master(): what refresh_copies does per chunk.
  // `shard_chunk` receives the offloaded shard's values of the same elements.
  void write_copies(int64_t first, int64_t count, const float* masters, std::byte* shard_chunk);
  // Widens reduced_grad into opt_grad when the gradient dtype is 16-bit.
  void widen_gradients();
  // Follows a change of the graph's 16-bit type (fp16 -> bf16 fallback): same sizes, new rounding.
  void retype(DType from, DType to);

  const ShardLayout& layout() const { return layout_; }
  const ShardingSpec& sharding() const { return spec_; }
  int64_t numel(int index) const { return graph_.value(graph_.params()[size_t(index)].value).shape.numel(); }
  const Graph& graph() const { return graph_; }

 private:
  // Bytes of each per-unit buffer (0: not allocated, or a view into another one).
  struct UnitSizes {
    int64_t compute = 0, master = 0, shard16 = 0, micro_grad = 0, grad_shard = 0, opt_grad = 0;
  };
  // Weight `ref`, a tensor-parallel slice, from its init stream (the adapters' for a uniform one)
  // where its whole tensor starts at `position`; returns the position after the whole tensor.
  uint64_t initialize_slice(Graph::WeightRef ref, uint64_t seed, uint64_t position);
  // Of elements [first, first + count) of weight `ref`, the sub-range [lo, hi) (relative to first)
  // that this rank draws: all of it, except for a trained weight where `shards` (shards_drawn()):
  // the part in the rank's shard of its unit.
  std::pair<int64_t, int64_t> drawn_part(Graph::WeightRef ref, int64_t first, int64_t count, bool shards) const;
  static UnitSizes unit_sizes(const ShardLayout& layout, const ShardingSpec& spec, const OffloadSpec& offload,
                              DType param, DType grad, size_t u);
  struct UnitBuffers {
    Buffer compute, master, shard16, micro_grad, grad_shard, opt_grad;
    float* master_ptr = nullptr;
    float* opt_grad_ptr = nullptr;
    std::byte* grad_shard_ptr = nullptr;
  };
  const Graph& graph_;
  ShardingSpec spec_;
  ShardLayout layout_;
  DType param_dtype_ = DType::f32, grad_dtype_ = DType::f32;
  bool grad_alias_ = false;
  bool masters_offloaded_ = false, shard_offloaded_ = false;
  class OffloadedState* offloaded_ = nullptr;
  std::vector<UnitBuffers> units_;
  Buffer frozen_;
  DType frozen_dtype_ = DType::f32;
};

}  // namespace engine
