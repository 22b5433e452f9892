// Trace: what each thread of a rank did during the steps a recipe chooses (telemetry.trace_steps),
// kept as timed events and written as Chrome trace-event JSON, which Perfetto's UI and
// chrome://tracing open. One process track per rank; in it one thread track per lane: the step's
// own thread (ops, collectives, data waits, the optimizer), the checkpoint writer, the swap I/O and,
// on a GPU run, the device's kernels (timed with CUDA events, placed at the host's clock when the
// replay began).
//
//   trace::start();
//   { trace::Scope op("op", node.op->name); op.set_work(flops, bytes); run(node); }
//   trace::stop();
//   std::string json = trace::to_json(trace::take(), rank);   // this rank's events
//
// Recording is process-wide, like a sampling profiler's switch: the layers that emit events
// (executor, optimizer, swap file, checkpoint writer) sit far apart, and threading a recorder
// through each of them would touch every constructor for a feature that is off in most steps.
// When it is off, a Scope costs one relaxed atomic load.
//
// Within a step, the compute lane's events are flat (no event holds another), so time per
// category is a plain sum and the events account for the step's time (tests/telemetry).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace engine::trace {

enum class Lane : int { compute = 0, checkpoint = 1, swap = 2, device = 3 };
const char* lane_name(Lane lane);

struct Event {
  std::string name;
  std::string category;  // step, op, communication, data, optimizer, offload, checkpoint, other
  Lane lane = Lane::compute;
  int64_t start_ns = 0, end_ns = 0;  // steady clock
  double flops = -1, bytes = -1;     // -1: not applicable
  std::string detail;                // the node's layer, a unit, a path
};

namespace detail {
inline std::atomic<bool> recording{false};
}
inline bool recording() { return detail::recording.load(std::memory_order_relaxed); }
void start();
void stop();
int64_t now_ns();
void record(Event event);   // thread-safe
std::vector<Event> take();  // every event recorded so far, in the order recorded; clears them

// Times the region from construction to destruction; recorded if recording was on at the start.
class Scope {
 public:
  Scope(std::string_view category, std::string_view name, Lane lane = Lane::compute);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  void set_work(double flops, double bytes) {
    event_.flops = flops;
    event_.bytes = bytes;
  }
  void set_detail(std::string detail) { event_.detail = std::move(detail); }
  bool active() const { return active_; }

 private:
  bool active_;
  Event event_;
};

// Stops recording for its lifetime (an evaluation inside a traced step is one event, not its ops).
class Suspend {
 public:
  Suspend() : was_(recording()) { stop(); }
  ~Suspend() {
    if (was_) start();
  }
  Suspend(const Suspend&) = delete;
  Suspend& operator=(const Suspend&) = delete;

 private:
  bool was_;
};

// A rank's events as a JSON array of trace events ("X" complete events in microseconds since
// `origin_ns`, plus the "M" metadata naming the rank's process and lanes).
std::string to_json(const std::vector<Event>& events, int rank, int64_t origin_ns);
// The trace file: {"traceEvents": [every rank's events], "displayTimeUnit": "ms", ...}.
std::string trace_file(const std::vector<std::string>& rank_arrays);

}  // namespace engine::trace
