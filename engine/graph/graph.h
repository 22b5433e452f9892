// Graph: one training step as a flat, topologically ordered list of nodes over typed values.
//
// Model builders append forward nodes through op builder functions (ops/<family>/<op>.h), which
// check shapes and compute nothing, so a shape error surfaces while the recipe is compiled, naming
// the layer. autodiff() appends the backward nodes; the planner (plan/) gives every activation an
// offset in one arena; the executor (runtime/) replays the nodes every step.
//
// Values live in one of six places:
//   activation  intermediate results, placed in the arena by the planner
//   host        activations moved out of the arena between forward and backward (cpu_checkpointing)
//   parameter   weights, in the flat buffer of their wrap unit (one transformer block = one unit)
//   frozen      weights that are read and never trained (LoRA's base model): one buffer in the
//               compute dtype, whole on every rank, with no gradient and no optimizer state
//   gradient    parameter gradients, laid out like the parameters; kernels accumulate into them
//   input       per-step data fed by the trainer (token ids, targets)
//
//   Graph g;
//   const int64_t C = 64;
//   int unit = g.add_unit("block.0");
//   ValueId x = g.add_input("x", Shape{8, C}, DType::f32);
//   ValueId w = g.add_param("h.0.mlp.c_fc.weight", Shape{4 * C, C}, unit, ParamInit::normal(0.02));
//   ValueId b = g.add_param("h.0.mlp.c_fc.bias", Shape{4 * C}, unit, ParamInit::zeros(), /*decay=*/false);
//   ValueId y = ops::linear(g, x, w, b, "h.0.mlp.c_fc");
//
// (tests/core/header_examples_test.cpp compiles and runs this example, and the Executor's.)
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace engine {

// Every arena value, f32 scratch copy (graph/op.h conversion_bytes, runtime/planned_casts.h) and
// device block starts on a multiple of this: 256 bytes is what cuBLASLt's
// heuristic assumes of a matrix unless told less (ops/linalg/linear.cu), so that a product's
// operands are aligned alike wherever a layout (a ZeRO stage, a world size) places them, and its
// algorithm, and so its bits, do not follow the layout.
inline constexpr int64_t kArenaAlignment = 256;
// `bytes` rounded up to a multiple of kArenaAlignment: what one such value or copy takes.
inline constexpr int64_t arena_aligned(int64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

struct OpDef;
using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

enum class Placement { activation, parameter, gradient, input, host, frozen };

struct Value {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Placement placement = Placement::activation;
  int param = -1;  // parameter and gradient values: index into Graph::params; frozen: Graph::frozen
};

// The bytes a value's elements take.
inline int64_t value_bytes(const Value& value) { return value.shape.numel() * int64_t(dtype_size(value.dtype)); }

// Per-op attributes, interpreted by each op (documented in its header).
struct Attrs {
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct Node {
  const OpDef* op = nullptr;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  bool accumulate = false;  // outputs are added to (gradients), not overwritten
  bool backward = false;
  std::string name;  // the layer it belongs to, for messages and traces
  int unit = -1;     // forward nodes: the wrap unit being built when the node was added
};

// How a tensor starts. `normal` draws from the seed's init stream in declaration order (parameters
// and frozen weights alike, so a model with frozen weights starts where the same model without them
// does); `uniform` (U(-bound, bound), LoRA's A matrices as PEFT's kaiming_uniform(a=sqrt(5)) makes
// them) draws from a stream of its own, so adding adapters moves no base weight.
struct ParamInit {
  enum class Kind { normal, zeros, ones, uniform } kind = Kind::normal;
  double std = 0.02;  // normal: the standard deviation; uniform: the bound
  static ParamInit normal(double s) { return {Kind::normal, s}; }
  static ParamInit zeros() { return {Kind::zeros, 0}; }
  static ParamInit ones() { return {Kind::ones, 0}; }
  static ParamInit uniform(double bound) { return {Kind::uniform, bound}; }
};

// How a weight rank `rank` of a tensor-parallel group of `size` holds maps onto the logical tensor
// the model declares (models/tensor_parallel.h). Viewed as a matrix (rows, columns) (a vector as
// (n, 1)), the logical tensor is split evenly either by columns (row-parallel layers: the rank holds
// every row, columns [rank C / size, (rank + 1) C / size)) or within each of `blocks`, ranges of
// logical rows (column-parallel layers: the rank holds its 1/size of each block's rows, blocks
// concatenated in order). Empty `logical`: the weight is whole (replicated on every rank).
struct TensorSlice {
  Shape logical;
  bool by_columns = false;
  std::vector<std::pair<int64_t, int64_t>> blocks;  // by rows: [begin, end) of logical rows
  int rank = 0, size = 1;

  bool split() const { return !logical.dims.empty(); }
  int64_t logical_rows() const { return logical.dims.empty() ? 0 : logical.dims[0]; }
  int64_t logical_columns() const { return logical.dims.size() == 2 ? logical.dims[1] : 1; }
  // This rank's logical rows [begin, end), in local order, and its columns.
  std::vector<std::pair<int64_t, int64_t>> rows() const;
  // The logical row of each of this rank's rows, in local order (rows() one by one).
  std::vector<int64_t> row_list() const;
  int64_t column_begin() const { return by_columns ? logical_columns() / size * rank : 0; }
  int64_t columns() const { return by_columns ? logical_columns() / size : logical_columns(); }
  int64_t numel() const;  // this rank's elements
  // This rank's elements (numel()) out of the whole logical tensor's, row-major.
  void take(const float* whole, float* part) const;
  TensorSlice for_rank(int other) const {
    TensorSlice s = *this;
    s.rank = other;
    return s;
  }
};

struct Param {
  std::string name;
  ValueId value = kNoValue;
  ValueId grad = kNoValue;  // kNoValue for a frozen weight
  int unit = 0;             // -1 for a frozen weight
  int64_t offset = 0;       // elements from the start of the unit's buffer (frozen: of the frozen buffer)
  ParamInit init;
  bool decay = true;  // weight decay applies (off for biases and norms by default)
  TensorSlice slice;  // this rank's part of the logical tensor (whole unless tensor-parallel)
  // Where in the init stream (words) the whole model draws this weight, for a graph that holds part
  // of the model (a pipeline stage); -1: in this graph's declaration order.
  int64_t init_position = -1;
};

// A wrap unit: parameters that ZeRO-3 gathers and releases together and offload moves together.
struct Unit {
  std::string name;
  int64_t numel = 0;
  bool block = false;  // one of the model's repeated blocks (transformer block, MLP layer)
};

class Graph {
 public:
  // Starts a wrap unit: parameters name it explicitly, forward nodes added after it belong to it.
  int add_unit(std::string name, bool block = false);
  ValueId add_param(std::string name, Shape shape, int unit, ParamInit init, bool decay = true);
  // Marks weight `value` (trained or frozen) as this rank's `slice` of a larger logical tensor
  // (tensor parallelism).
  void set_slice(ValueId value, TensorSlice slice);
  // A weight the step reads and never trains (Placement::frozen).
  ValueId add_frozen(std::string name, Shape shape, ParamInit init);
  ValueId add_input(std::string name, Shape shape, DType dtype);
  // An input whose gradient the backward computes (a pipeline stage's input activation).
  void mark_differentiable(ValueId input) { differentiable_.push_back(input); }
  const std::vector<ValueId>& differentiable() const { return differentiable_; }
  ValueId add_activation(std::string name, Shape shape, DType dtype = DType::f32);
  // Appends a node; returns nothing: builders create output values first.
  void add_node(Node node);

  const Value& value(ValueId id) const { return values_[static_cast<size_t>(id)]; }
  // A deque: builders hold references to values while adding more.
  const std::deque<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Param>& params() const { return params_; }
  const std::vector<Param>& frozen() const { return frozen_; }
  int64_t frozen_count() const { return frozen_numel_; }  // elements of every frozen weight
  // Every weight, trained or frozen, in the order the builder declared them (what initialisation
  // draws in, and what a weights file lists).
  struct WeightRef {
    bool frozen;
    int index;  // into params() or frozen()
  };
  const std::vector<WeightRef>& weights() const { return weights_; }
  const Param& weight(WeightRef ref) const {
    return ref.frozen ? frozen_[size_t(ref.index)] : params_[size_t(ref.index)];
  }
  const std::vector<Unit>& units() const { return units_; }
  int64_t param_count() const;
  // The type every parameter value, and every gradient value, has (precision.h makes them alike);
  // f32 for a graph without parameters.
  DType param_dtype() const { return params_.empty() ? DType::f32 : value(params_[0].value).dtype; }
  DType grad_dtype() const { return params_.empty() ? DType::f32 : value(params_[0].grad).dtype; }

  ValueId loss() const { return loss_; }
  void set_loss(ValueId loss) { loss_ = loss; }
  size_t forward_size() const { return forward_size_; }  // nodes before autodiff appended any
  void mark_forward_end() { forward_size_ = nodes_.size(); }
  void set_forward_size(size_t size) { forward_size_ = size; }
  // For graph passes (recompute) that rewrite the backward part of the node list.
  std::vector<Node>& mutable_nodes() { return nodes_; }
  // Drops the nodes whose index `removed` marks (fusion passes), keeping the forward part's end.
  void remove_nodes(const std::vector<bool>& removed);
  Value& mutable_value(ValueId id) { return values_[static_cast<size_t>(id)]; }
  // For the wrap pass, which regroups units (and so every parameter's unit and offset).
  std::vector<Param>& mutable_params() { return params_; }
  std::vector<Param>& mutable_frozen() { return frozen_; }
  std::vector<Unit>& mutable_units() { return units_; }

 private:
  std::deque<Value> values_;
  std::vector<Node> nodes_;
  std::vector<Param> params_;
  std::vector<Param> frozen_;
  int64_t frozen_numel_ = 0;
  std::vector<WeightRef> weights_;
  std::vector<Unit> units_;
  std::vector<ValueId> differentiable_;
  ValueId loss_ = kNoValue;
  size_t forward_size_ = 0;
};

}  // namespace engine
