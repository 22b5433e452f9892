#include "graph/recompute.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "core/error.h"
#include "cuda_kernels.h"

namespace engine {

namespace {

void host_copy_cpu(const Node& node, const KernelContext& ctx) {
  const Value& v = ctx.graph->value(node.inputs[0]);
  std::memcpy(ctx.pointers[size_t(node.outputs[0])], ctx.pointers[size_t(node.inputs[0])], size_t(value_bytes(v)));
}

// Ops that selective checkpointing recomputes carry OpDef::cheap_to_recompute: cheap per element,
// and their outputs are as large as their inputs, which the backward keeps anyway (attention scores
// are never stored: the fused attention kernel recomputes them itself).
bool is_cheap(const OpDef* op) { return op->cheap_to_recompute; }

struct RecomputeSegment {
  std::vector<size_t> nodes;  // forward node indices, ascending
  std::set<ValueId> recompute;
  size_t insert_at = 0;  // index of the first backward node that reads a recomputed value
  std::vector<ValueId> kept_inputs;
};

std::vector<RecomputeSegment> choose_segments(const Graph& g, const recipe::ActivationCheckpointingSection& policy) {
  std::vector<RecomputeSegment> segments;
  const size_t forward = g.forward_size();
  auto in_block = [&](const Node& n) { return n.unit >= 0 && g.units()[size_t(n.unit)].block; };
  if (policy.policy == recipe::CheckpointPolicy::selective) {
    for (size_t i = 0; i < forward; ++i)
      if (in_block(g.nodes()[i]) && is_cheap(g.nodes()[i].op)) segments.push_back({{i}, {}, 0, {}});
    return segments;
  }
  int ordinal = 0;
  for (size_t u = 0; u < g.units().size(); ++u) {
    if (!g.units()[u].block) continue;
    const bool chosen = policy.policy == recipe::CheckpointPolicy::full || ordinal % policy.k == 0;
    ++ordinal;
    if (!chosen) continue;
    RecomputeSegment s;
    for (size_t i = 0; i < forward; ++i)
      if (g.nodes()[i].unit == int(u)) s.nodes.push_back(i);
    if (!s.nodes.empty()) segments.push_back(std::move(s));
  }
  return segments;
}

}  // namespace

const OpDef kHostCopy{.name = "host_copy",
                      .cpu = host_copy_cpu,
                      .cuda = cuda::host_copy,
                      .native_16bit = "a byte copy",
                      .cuda_16bit = "a byte copy"};

namespace {

// Who reads each value: node indices, ascending (forward readers before backward ones).
using Readers = std::vector<std::vector<size_t>>;

Readers readers_of(const Graph& g) {
  Readers readers(g.values().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId in : g.nodes()[i].inputs) readers[size_t(in)].push_back(i);
  return readers;
}

bool is_activation(const Graph& g, ValueId v) { return g.value(v).placement == Placement::activation; }

// The loss kernel overwrites its logits with their gradient, which the backward then reads: a
// recomputed copy would hold logits instead. Only a wrap unit that holds the head as well as a
// block puts them in a segment.
std::set<ValueId> overwritten_by_loss(const Graph& g) {
  std::set<ValueId> overwritten;
  for (size_t i = 0; i < g.forward_size(); ++i) {
    const Node& n = g.nodes()[i];
    if (std::find(n.outputs.begin(), n.outputs.end(), g.loss()) != n.outputs.end())
      overwritten.insert(n.inputs.begin(), n.inputs.end());
  }
  return overwritten;
}

// Fills a chosen segment: the activations it recomputes (read by the backward; under full and
// every_k not read outside the segment, so a block's output stays as the next block's kept input),
// the nodes those depend on within it (the clones), where the clones go (just before the first
// backward reader of a recomputed value) and the activations they read that they do not make.
void plan_segment(const Graph& g, const Readers& readers, const std::set<ValueId>& overwritten, bool selective,
                  RecomputeSegment& s) {
  const size_t forward = g.forward_size();
  const std::set<size_t> members(s.nodes.begin(), s.nodes.end());
  for (size_t i : s.nodes)
    for (ValueId out : g.nodes()[i].outputs) {
      if (!is_activation(g, out)) continue;
      bool read_backward = false, read_outside = false;
      for (size_t r : readers[size_t(out)]) {
        if (r >= forward)
          read_backward = true;
        else if (!members.count(r))
          read_outside = true;
      }
      if (read_backward && (selective || !read_outside) && !overwritten.count(out)) s.recompute.insert(out);
    }
  if (s.recompute.empty()) return;
  std::set<ValueId> needed(s.recompute.begin(), s.recompute.end());
  std::vector<size_t> cloned;
  for (auto it = s.nodes.rbegin(); it != s.nodes.rend(); ++it) {
    const Node& n = g.nodes()[*it];
    const bool need = std::any_of(n.outputs.begin(), n.outputs.end(), [&](ValueId v) { return needed.count(v) != 0; });
    if (!need) continue;
    cloned.push_back(*it);
    for (ValueId in : n.inputs) needed.insert(in);
  }
  std::reverse(cloned.begin(), cloned.end());
  s.nodes = std::move(cloned);
  s.insert_at = g.nodes().size();
  for (ValueId v : s.recompute)
    for (size_t r : readers[size_t(v)])
      if (r >= forward) s.insert_at = std::min(s.insert_at, r);
  std::set<ValueId> produced;
  for (size_t i : s.nodes)
    for (ValueId out : g.nodes()[i].outputs) produced.insert(out);
  for (size_t i : s.nodes)
    for (ValueId in : g.nodes()[i].inputs)
      if (!produced.count(in) && is_activation(g, in) &&
          std::find(s.kept_inputs.begin(), s.kept_inputs.end(), in) == s.kept_inputs.end())
        s.kept_inputs.push_back(in);
}

// What the rebuilt node list gains around the original nodes, and which values later readers take
// instead of the originals.
struct Insertions {
  explicit Insertions(size_t total) : before(total + 1), after(total) {}
  std::vector<std::vector<Node>> before;   // before node i (i == total: after the last: a bug)
  std::vector<std::vector<Node>> after;    // after forward node i
  std::map<ValueId, ValueId> replacement;  // for backward readers (and later clones)
  std::map<ValueId, ValueId> prefetched;   // kept inputs back from host memory, for clones too
};

// Each segment's clones, writing fresh "@recompute" activations, before its insertion point.
void clone_segments(Graph& g, const std::vector<RecomputeSegment>& segments, Insertions& ins, RecomputeReport& report) {
  for (const RecomputeSegment& s : segments) {
    std::map<ValueId, ValueId> local;
    for (size_t i : s.nodes) {
      Node clone = g.nodes()[i];
      for (ValueId& in : clone.inputs) {
        if (auto it = local.find(in); it != local.end())
          in = it->second;
        else if (auto r = ins.replacement.find(in); r != ins.replacement.end())
          in = r->second;
      }
      for (ValueId& out : clone.outputs) {
        const Value v = g.value(out);
        ValueId copy = g.add_activation(v.name + "@recompute", v.shape, v.dtype);
        local[out] = copy;
        out = copy;
      }
      clone.backward = true;
      clone.name += " (recompute)";
      if (clone.op->flops) report.extra_flops += clone.op->flops(g, clone);
      ins.before[s.insert_at].push_back(std::move(clone));
      ++report.cloned_nodes;
    }
    for (ValueId v : s.recompute) ins.replacement[v] = local.at(v);
    ++report.segments;
  }
}

// cpu_checkpointing: each kept input is copied to host memory after its last forward reader and
// back before it is needed. Segments are in backward order: a kept input is prefetched where the
// previous segment's recompute starts, one block ahead of its own.
void offload_kept_inputs(Graph& g, const std::vector<RecomputeSegment>& segments, const Readers& readers,
                         Insertions& ins, RecomputeReport& report) {
  const size_t forward = g.forward_size(), total = g.nodes().size();
  for (size_t k = 0; k < segments.size(); ++k) {
    const RecomputeSegment& s = segments[k];
    for (ValueId in : s.kept_inputs) {
      if (ins.replacement.count(in)) continue;
      size_t last_forward = 0, first_later = total;
      for (size_t r : readers[size_t(in)]) {
        if (r < forward)
          last_forward = std::max(last_forward, r);
        else
          first_later = std::min(first_later, r);
      }
      const size_t prefetch_at = std::min({first_later, s.insert_at, k > 0 ? segments[k - 1].insert_at : total});
      const Value v = g.value(in);
      ValueId host = g.add_activation(v.name + "@host", v.shape, v.dtype);
      g.mutable_value(host).placement = Placement::host;
      ValueId back = g.add_activation(v.name + "@prefetched", v.shape, v.dtype);
      ins.after[last_forward].push_back(Node{&kHostCopy, {in}, {host}, {}, false, true, v.name + " (offload)"});
      ins.before[prefetch_at].insert(ins.before[prefetch_at].begin(),
                                     Node{&kHostCopy, {host}, {back}, {}, false, true, v.name + " (prefetch)"});
      ins.replacement[in] = back;
      ins.prefetched[in] = back;
      report.offloaded_bytes += value_bytes(v);
    }
  }
}

// The node list with the insertions: offloads after their last forward reader, clones and
// prefetches before their first backward reader, and every later reader pointed at the
// replacements. Clones already read the recomputed values of segments inserted before them; here
// they only switch to prefetched inputs: a value recomputed by a segment inserted later is not
// there yet (a cheap op reading another's output under selective, as in a unit holding the
// embeddings' dropout). Nodes added to the forward part are marked backward: evaluation plans
// skip them.
void rebuild(Graph& g, Insertions& ins, const RecomputeReport& report) {
  const size_t forward = g.forward_size(), total = g.nodes().size();
  std::vector<Node> rebuilt;
  rebuilt.reserve(total + size_t(report.cloned_nodes) * 2);
  size_t forward_size = 0;
  const std::vector<Node> original = g.nodes();
  for (size_t i = 0; i < total; ++i) {
    for (Node& n : ins.before[i]) {
      if (n.op != &kHostCopy)
        for (ValueId& in : n.inputs)
          if (auto r = ins.prefetched.find(in); r != ins.prefetched.end()) in = r->second;
      rebuilt.push_back(std::move(n));
    }
    Node node = original[i];
    if (i >= forward)
      for (ValueId& in : node.inputs)
        if (auto r = ins.replacement.find(in); r != ins.replacement.end()) in = r->second;
    rebuilt.push_back(std::move(node));
    if (i < forward)
      for (Node& n : ins.after[i]) rebuilt.push_back(std::move(n));
    if (i + 1 == forward) forward_size = rebuilt.size();
  }
  ENGINE_CHECK(ins.before[total].empty(), "recompute segment without a backward reader");
  g.mutable_nodes() = std::move(rebuilt);
  g.set_forward_size(forward_size);
}

}  // namespace

RecomputeReport apply_recompute(Graph& g, const recipe::ActivationCheckpointingSection& policy) {
  RecomputeReport report;
  if (policy.policy == recipe::CheckpointPolicy::none) return report;
  const bool selective = policy.policy == recipe::CheckpointPolicy::selective;
  ENGINE_CHECK(g.forward_size() > 0 && g.forward_size() < g.nodes().size(), "recompute runs after autodiff");
  const Readers readers = readers_of(g);
  const std::set<ValueId> overwritten = overwritten_by_loss(g);
  std::vector<RecomputeSegment> segments = choose_segments(g, policy);
  for (RecomputeSegment& s : segments) plan_segment(g, readers, overwritten, selective, s);
  std::erase_if(segments, [](const RecomputeSegment& s) { return s.recompute.empty(); });
  std::stable_sort(segments.begin(), segments.end(),
                   [](const RecomputeSegment& a, const RecomputeSegment& b) { return a.insert_at < b.insert_at; });
  Insertions ins(g.nodes().size());
  clone_segments(g, segments, ins, report);
  if (policy.cpu_checkpointing && !selective) offload_kept_inputs(g, segments, readers, ins, report);
  rebuild(g, ins, report);
  return report;
}

}  // namespace engine
