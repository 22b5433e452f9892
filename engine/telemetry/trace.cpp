#include "telemetry/trace.h"

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>

namespace engine::trace {

namespace {

std::mutex& events_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<Event>& events() {
  static std::vector<Event> all;
  return all;
}

}  // namespace

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute:
      return "step";
    case Lane::checkpoint:
      return "checkpoint writer";
    case Lane::swap:
      return "swap I/O";
    case Lane::device:
      return "GPU kernels";
  }
  return "?";
}

void start() { detail::recording.store(true, std::memory_order_relaxed); }
void stop() { detail::recording.store(false, std::memory_order_relaxed); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(Event event) {
  std::lock_guard lock(events_mutex());
  events().push_back(std::move(event));
}

std::vector<Event> take() {
  std::lock_guard lock(events_mutex());
  return std::exchange(events(), {});
}

Scope::Scope(std::string_view category, std::string_view name, Lane lane) : active_(recording()) {
  if (!active_) return;
  event_.category = category;
  event_.name = name;
  event_.lane = lane;
  event_.start_ns = now_ns();
}

Scope::~Scope() {
  if (!active_) return;
  event_.end_ns = now_ns();
  record(std::move(event_));
}

std::string to_json(const std::vector<Event>& events, int rank, int64_t origin_ns) {
  nlohmann::json all = nlohmann::json::array();
  all.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  all.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  for (Lane lane : {Lane::compute, Lane::checkpoint, Lane::swap, Lane::device})
    all.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", rank},
                   {"tid", int(lane)},
                   {"args", {{"name", lane_name(lane)}}}});
  int64_t async_id = 0;
  for (const Event& e : events) {
    nlohmann::json args = nlohmann::json::object();
    if (e.flops >= 0) args["flops"] = e.flops;
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    if (!e.detail.empty()) args["detail"] = e.detail;
    // Microseconds with nanosecond decimals: Perfetto keeps them, and sums stay exact enough.
    const double ts = double(e.start_ns - origin_ns) / 1e3, dur = double(e.end_ns - e.start_ns) / 1e3;
    nlohmann::json event{{"name", e.name}, {"cat", e.category}, {"pid", rank}, {"tid", int(e.lane)}};
    if (e.lane == Lane::swap) {
      // Transfers overlap one another (reads ahead, writes behind): async slices, which may.
      event["id"] = std::to_string(rank) + ":" + std::to_string(++async_id);
      nlohmann::json end = event;
      event["ph"] = "b";
      event["ts"] = ts;
      event["args"] = std::move(args);
      end["ph"] = "e";
      end["ts"] = ts + dur;
      all.push_back(std::move(event));
      all.push_back(std::move(end));
      continue;
    }
    event["ph"] = "X";
    event["ts"] = ts;
    event["dur"] = dur;
    event["args"] = std::move(args);
    all.push_back(std::move(event));
  }
  return all.dump();
}

std::string trace_file(const std::vector<std::string>& rank_arrays) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"engine\"},\"traceEvents\":[";
  bool first = true;
  for (const std::string& array : rank_arrays) {
    // Each is "[...]": splice its elements in.
    if (array.size() <= 2) continue;
    if (!first) out += ",";
    out.append(array, 1, array.size() - 2);
    first = false;
  }
  return out + "]}\n";
}

}  // namespace engine::trace
