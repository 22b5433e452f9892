#include "models/pipeline_stage.h"

#include <algorithm>
#include <limits>
#include <map>

#include "core/error.h"
#include "parallel/pipeline.h"

namespace engine {

std::vector<int> stage_boundaries(const Graph& whole, int stages) {
  const auto units = int(whole.units().size());
  std::vector<double> flops(size_t(units), 0.0);
  for (size_t i = 0; i < whole.forward_size(); ++i) {
    const Node& node = whole.nodes()[i];
    if (node.unit >= 0 && node.op->flops) flops[size_t(node.unit)] += node.op->flops(whole, node);
  }
  // best[s][u]: the least largest stage of units [0, u) cut into s stages, each with a block.
  const double none = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(units) + 1, none));
  std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(units) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int u = 1; u <= units; ++u)
      for (int from = u - 1; from >= 0; --from) {
        bool has_block = false;
        double sum = 0;
        for (int k = from; k < u; ++k) {
          has_block = has_block || whole.units()[size_t(k)].block;
          sum += flops[size_t(k)];
        }
        if (!has_block || best[size_t(s - 1)][size_t(from)] == none) continue;
        const double worst = std::max(best[size_t(s - 1)][size_t(from)], sum);
        if (worst < best[size_t(s)][size_t(u)]) {
          best[size_t(s)][size_t(u)] = worst;
          cut[size_t(s)][size_t(u)] = from;
        }
      }
  if (best[size_t(stages)][size_t(units)] == none)
    throw UserError("the model has fewer blocks than distributed.pipeline_parallel " + std::to_string(stages) +
                    " stages");
  std::vector<int> boundaries(size_t(stages) + 1);
  boundaries[size_t(stages)] = units;
  for (int s = stages, u = units; s > 0; --s) u = boundaries[size_t(s - 1)] = cut[size_t(s)][size_t(u)];
  return boundaries;
}

namespace {

// Where the whole model draws each weight in its init stream (ParameterStore::initialize's order):
// four words a normal, two a uniform (the adapters' own stream).
std::map<std::string, int64_t> init_positions(const Graph& whole) {
  std::map<std::string, int64_t> positions;
  int64_t position = 0, uniform_position = 0;
  for (const Graph::WeightRef ref : whole.weights()) {
    const Param& p = whole.weight(ref);
    // A tensor-parallel slice draws from where its whole tensor does, and the stream passes all of it.
    const int64_t numel = p.slice.split() ? p.slice.logical.numel() : whole.value(p.value).shape.numel();
    if (p.init.kind == ParamInit::Kind::uniform) {
      positions[p.name] = uniform_position;
      uniform_position += 2 * numel;
    } else {
      positions[p.name] = position;
      if (p.init.kind == ParamInit::Kind::normal) position += 4 * numel;
    }
  }
  return positions;
}

int stage_of(int unit, const std::vector<int>& boundaries) {
  return int(std::upper_bound(boundaries.begin(), boundaries.end(), unit) - boundaries.begin()) - 1;
}

}  // namespace

ModelGraph cut_stage(const ModelGraph& whole, int stage, const std::vector<int>& boundaries) {
  const Graph& w = whole.graph;
  const int stages = int(boundaries.size()) - 1;
  const bool last = stage == stages - 1;
  const std::map<std::string, int64_t> positions = init_positions(w);
  // Which stages read each weight, and which read each activation.
  std::map<ValueId, std::vector<int>> readers;
  for (size_t i = 0; i < w.forward_size(); ++i)
    for (ValueId in : w.nodes()[i].inputs) readers[in].push_back(stage_of(w.nodes()[i].unit, boundaries));
  auto shared = [&](ValueId v) {
    const auto& r = readers[v];
    return w.value(v).placement == Placement::parameter &&
           std::any_of(r.begin(), r.end(), [&](int s) { return s != r.front(); });
  };

  ModelGraph m;
  m.batch = whole.batch;
  m.sequence = whole.sequence;
  m.classes = whole.classes;
  Graph& g = m.graph;
  std::map<ValueId, ValueId> mapped;
  std::map<int, int> units;                             // whole unit -> this stage's
  std::map<ValueId, int> tied;                          // shared weight -> its unit here
  std::vector<int> produced_by(w.values().size(), -1);  // stage of the node that writes each value
  for (size_t i = 0; i < w.forward_size(); ++i)
    for (ValueId out : w.nodes()[i].outputs) produced_by[size_t(out)] = stage_of(w.nodes()[i].unit, boundaries);

  auto unit_of = [&](int whole_unit) {
    auto it = units.find(whole_unit);
    if (it != units.end()) return it->second;
    const Unit& u = w.units()[size_t(whole_unit)];
    return units[whole_unit] = g.add_unit(u.name, u.block);
  };
  // A value as this stage's graph holds it, created at its first use.
  auto value = [&](ValueId id) -> ValueId {
    if (auto it = mapped.find(id); it != mapped.end()) return it->second;
    const Value& v = w.value(id);
    ValueId here = kNoValue;
    if (v.placement == Placement::input) {
      here = g.add_input(v.name, v.shape, v.dtype);
    } else if (v.placement == Placement::parameter) {
      const Param& p = w.params()[size_t(v.param)];
      int unit;
      if (shared(id)) {
        if (!tied.count(id)) tied[id] = g.add_unit(kTiedUnitPrefix + p.name);
        unit = tied[id];
      } else {
        unit = unit_of(p.unit);
      }
      here = g.add_param(p.name, v.shape, unit, p.init, p.decay);
      g.mutable_params().back().init_position = positions.at(p.name);
      if (p.slice.split()) g.set_slice(here, p.slice);
    } else if (v.placement == Placement::frozen) {  // every stage that reads it holds it (a tied one too)
      const Param& p = w.frozen()[size_t(v.param)];
      here = g.add_frozen(p.name, v.shape, p.init);
      g.mutable_frozen().back().init_position = positions.at(p.name);
      if (p.slice.split()) g.set_slice(here, p.slice);
    } else if (produced_by[size_t(id)] == stage) {
      here = g.add_activation(v.name, v.shape, v.dtype);
    } else {  // made by an earlier stage: what it hands on
      if (m.stage_input != kNoValue)
        throw UserError("stage " + std::to_string(stage) +
                        " of the pipeline reads more than one activation of the "
                        "stages before it (" +
                        v.name + "): blocks must pass one residual stream");
      m.stage_input = g.add_input("stage_input", v.shape, DType::f32);
      here = ops::stage_input(g, m.stage_input, "stage_input");
    }
    return mapped[id] = here;
  };

  // The stage's nodes: their units first (in the whole model's order), weights as nodes read them.
  for (int u = boundaries[size_t(stage)]; u < boundaries[size_t(stage) + 1]; ++u) unit_of(u);
  for (size_t i = 0; i < w.forward_size(); ++i) {
    const Node& node = w.nodes()[i];
    if (stage_of(node.unit, boundaries) != stage) continue;
    Node copy = node;
    for (ValueId& in : copy.inputs) in = value(in);
    for (ValueId& out : copy.outputs) out = value(out);
    copy.unit = units.at(node.unit);
    g.add_node(std::move(copy));
  }
  // Units without trained weights (Llama's embeddings, its table tied to the head; LoRA's frozen
  // head) are dropped.
  std::vector<Unit>& kept = g.mutable_units();
  std::vector<int> renumber(kept.size(), -1);
  std::vector<Unit> nonempty;
  for (size_t u = 0; u < kept.size(); ++u)
    if (kept[u].numel > 0) {
      renumber[u] = int(nonempty.size());
      nonempty.push_back(kept[u]);
    }
  for (Param& p : g.mutable_params()) p.unit = renumber[size_t(p.unit)];
  // A dropped unit's nodes (the embedding's, a LoRA head's over frozen weights) belong to no unit,
  // as no block's: activation checkpointing leaves them out of the blocks it recomputes.
  for (Node& node : g.mutable_nodes())
    if (node.unit >= 0) node.unit = renumber[size_t(node.unit)];
  kept = std::move(nonempty);

  auto find = [&](ValueId id) { return id == kNoValue || !mapped.count(id) ? kNoValue : mapped.at(id); };
  m.inputs = find(whole.inputs);
  m.targets = find(whole.targets);
  m.positions = find(whole.positions);
  if (last) {
    m.losses = mapped.at(whole.losses);
    m.logits = find(whole.logits);
    g.set_loss(m.losses);
  } else {
    // The one activation a later stage reads: what this stage hands on.
    ValueId handed = kNoValue;
    for (auto [whole_id, here] : mapped) {
      if (w.value(whole_id).placement != Placement::activation || produced_by[size_t(whole_id)] != stage) continue;
      for (int reader : readers[whole_id])
        if (reader > stage) {
          if (handed != kNoValue && handed != here)
            throw UserError("stage " + std::to_string(stage) + " of the pipeline hands more than one activation on");
          handed = here;
        }
    }
    ENGINE_CHECK(handed != kNoValue, "a pipeline stage hands nothing on");
    m.stage_output_gradient = g.add_input("stage_output_gradient", g.value(handed).shape, DType::f32);
    m.stage_output = ops::stage_output(g, handed, m.stage_output_gradient, "stage_output");
    g.set_loss(m.stage_output);
  }
  g.mark_forward_end();
  return m;
}

std::vector<int> pipeline_boundaries(const recipe::Recipe& recipe, int stages, int tensor_parallel) {
  const ModelGraph model = build_model(recipe, 1, 1.0, {tensor_parallel, 0});
  const std::vector<double>& blocks = recipe.distributed.pipeline_blocks;
  if (blocks.empty()) return stage_boundaries(model.graph, stages);
  // As the recipe lists them: stage s (after the first) starts at its first block's unit.
  std::vector<int> block_units;
  for (int u = 0; u < int(model.graph.units().size()); ++u)
    if (model.graph.units()[size_t(u)].block) block_units.push_back(u);
  ENGINE_CHECK(int(blocks.size()) == stages, "distributed.pipeline_blocks lists another number of stages");
  std::vector<int> boundaries{0};
  int64_t first = 0;
  for (int s = 1; s < stages; ++s) {
    first += int64_t(blocks[size_t(s - 1)]);
    ENGINE_CHECK(first < int64_t(block_units.size()),
                 "distributed.pipeline_blocks lists more blocks than the model has");
    boundaries.push_back(block_units[size_t(first)]);
  }
  boundaries.push_back(int(model.graph.units().size()));
  return boundaries;
}

std::vector<ModelGraph> cut_stages(const ModelGraph& whole, const std::vector<int>& boundaries) {
  std::vector<ModelGraph> graphs;
  for (int stage = 0; stage + 1 < int(boundaries.size()); ++stage)
    graphs.push_back(cut_stage(whole, stage, boundaries));
  return graphs;
}

}  // namespace engine
