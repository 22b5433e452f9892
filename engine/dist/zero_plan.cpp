#include "dist/zero_plan.h"

#include <algorithm>
#include <deque>
#include <numeric>

namespace engine {

namespace {

using Kind = StepAction::Kind;

// Actions at one position run in this order: buffers bound, reductions started and waited for,
// gathers started (prefetch first), then the gather the next node needs waited for.
int order(Kind kind) {
  switch (kind) {
    case Kind::grads_into:
      return 0;
    case Kind::reduce:
      return 1;
    case Kind::wait:
      return 2;
    case Kind::gather:
      return 3;
    case Kind::use_params:
      return 4;
  }
  return 5;
}

int unit_of(const Graph& g, ValueId id, Placement placement) {
  const Value& v = g.value(id);
  return v.placement == placement ? g.params()[size_t(v.param)].unit : -1;
}

struct Cluster {
  int unit, first, last;
};

// Runs of reads of one unit's parameters with no other unit read in between.
std::vector<Cluster> read_clusters(const Graph& g, const std::vector<size_t>& nodes) {
  const size_t units = g.units().size();
  std::vector<int> open(units, -1), last_read(units, -1);
  std::vector<Cluster> clusters;
  for (size_t p = 0; p < nodes.size(); ++p) {
    std::vector<int> read;
    for (ValueId id : g.nodes()[nodes[p]].inputs)
      if (int u = unit_of(g, id, Placement::parameter); u >= 0 && std::find(read.begin(), read.end(), u) == read.end())
        read.push_back(u);
    for (int u : read) {
      bool other_since = false;
      if (open[size_t(u)] >= 0)
        for (size_t v = 0; v < units; ++v)
          if (int(v) != u && last_read[v] > clusters[size_t(open[size_t(u)])].last) other_since = true;
      if (open[size_t(u)] < 0 || other_since) {
        open[size_t(u)] = int(clusters.size());
        clusters.push_back({u, int(p), int(p)});
      }
      clusters[size_t(open[size_t(u)])].last = int(p);
    }
    for (int u : read) last_read[size_t(u)] = int(p);
  }
  std::stable_sort(clusters.begin(), clusters.end(),
                   [](const Cluster& a, const Cluster& b) { return a.first < b.first; });
  return clusters;
}

}  // namespace

std::vector<GradientWrites> gradient_writes(const Graph& graph, const std::vector<size_t>& nodes) {
  std::vector<GradientWrites> writes(graph.units().size());
  for (size_t p = 0; p < nodes.size(); ++p)
    for (ValueId id : graph.nodes()[nodes[p]].outputs)
      if (int u = unit_of(graph, id, Placement::gradient); u >= 0) {
        GradientWrites& w = writes[size_t(u)];
        if (w.first < 0) w.first = int(p);
        w.last = int(p);
      }
  return writes;
}

Plan plan_zero_step(Graph& graph, const ShardLayout& layout, std::vector<size_t> nodes,
                    const std::vector<ValueId>& keep, const ZeroPlanSpec& spec, bool training) {
  const int end = int(nodes.size());
  std::vector<std::vector<StepAction>> actions(nodes.size() + 1);
  std::vector<LiveRange> ranges;
  const DType compute = graph.param_dtype(), grad = graph.grad_dtype();

  if (spec.stage == 3) {
    std::vector<Cluster> clusters = read_clusters(graph, nodes);
    for (size_t i = 0; i < clusters.size(); ++i) {
      const Cluster& c = clusters[i];
      const std::string& name = graph.units()[size_t(c.unit)].name;
      ValueId buffer = graph.add_activation("gathered " + name + " #" + std::to_string(i),
                                            Shape{layout.padded(size_t(c.unit))}, compute);
      const int start = i >= size_t(spec.prefetch) ? clusters[i - size_t(spec.prefetch)].first : 0;
      actions[size_t(start)].push_back({Kind::gather, c.unit, buffer});
      actions[size_t(c.first)].push_back({Kind::use_params, c.unit, buffer});
      ranges.push_back({buffer, start, c.last});
    }
  }

  if (training && spec.reduce) {
    const size_t units = graph.units().size();
    // A unit no node writes is reduced at the end (its zeros, as every rank's).
    std::vector<int> first_write(units, end), last_write(units, end - 1);
    const std::vector<GradientWrites> writes = gradient_writes(graph, nodes);
    for (size_t u = 0; u < units; ++u)
      if (writes[u].last >= 0) {
        first_write[u] = writes[u].first;
        last_write[u] = writes[u].last;
      }
    std::vector<int> by_completion(units);
    std::iota(by_completion.begin(), by_completion.end(), 0);
    std::stable_sort(by_completion.begin(), by_completion.end(),
                     [&](int a, int b) { return last_write[size_t(a)] < last_write[size_t(b)]; });
    std::vector<ValueId> buffers(units, kNoValue);
    std::vector<int> range_of(units, -1);
    std::deque<int> in_flight;
    int64_t in_flight_elements = 0;
    auto wait_oldest = [&](int position) {
      const int u = in_flight.front();
      in_flight.pop_front();
      in_flight_elements -= layout.padded(size_t(u));
      actions[size_t(position)].push_back({Kind::wait, u, kNoValue});
      // Live through the wait's own position: a buffer bound there (grads_into runs before waits)
      // must not share memory with one whose reduction is still reading it.
      if (range_of[size_t(u)] >= 0) ranges[size_t(range_of[size_t(u)])].last = position;
    };
    for (int u : by_completion) {
      const int start = last_write[size_t(u)] + 1;
      if (spec.stage >= 2) {
        buffers[size_t(u)] =
            graph.add_activation("gradient " + graph.units()[size_t(u)].name, Shape{layout.padded(size_t(u))}, grad);
        actions[size_t(first_write[size_t(u)])].push_back({Kind::grads_into, u, buffers[size_t(u)]});
        range_of[size_t(u)] = int(ranges.size());
        ranges.push_back({buffers[size_t(u)], first_write[size_t(u)], end});
      }
      actions[size_t(start)].push_back({Kind::reduce, u, buffers[size_t(u)]});
      in_flight.push_back(u);
      in_flight_elements += layout.padded(size_t(u));
      while (in_flight.size() > 1 && in_flight_elements > spec.bucket_size) wait_oldest(start);
    }
    while (!in_flight.empty()) wait_oldest(end);
  }

  Plan plan = plan_step(graph, std::move(nodes), keep, ranges);
  bool any = false;
  for (auto& list : actions) {
    std::stable_sort(list.begin(), list.end(),
                     [](const StepAction& a, const StepAction& b) { return order(a.kind) < order(b.kind); });
    any = any || !list.empty();
  }
  if (any) plan.actions = std::move(actions);
  return plan;
}

}  // namespace engine
