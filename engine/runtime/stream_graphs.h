// StreamGraphs: work a host function enqueues on a CUDA stream, replayed as a CUDA graph. The first
// run of a key is eager (the kernels' one-time set-up happens there: cuBLASLt's algorithm choice,
// cuDNN's plans); the second is captured and launched; later ones launch the graph. What changes
// from run to run must live in device memory that the work reads (KernelContext::step_scalars, the
// optimizer's scalars), so a graph never needs capturing again; reset() drops every graph when
// what the host chose at enqueue time (a value's type, a buffer's address) changed. A key whose
// capture fails (CUDA refuses a call in it, or the graph's instantiation) runs eagerly from then
// on, with a warning: the first eager run showed its work runs. CUDA builds only.
//
//   StreamGraphs graphs;
//   graphs.run("update", stream, [&] { kernel_a<<<..., stream>>>(...); kernel_b<<<...>>>(...); });
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace engine {

class StreamGraphs {
 public:
  StreamGraphs() = default;
  StreamGraphs(const StreamGraphs&) = delete;
  StreamGraphs& operator=(const StreamGraphs&) = delete;
  ~StreamGraphs() { reset(); }

  // Enqueues `enqueue`'s work on `stream`: eagerly (disabled, or the key's first run), or as the key's graph.
  void run(const std::string& key, cudaStream_t stream, const std::function<void()>& enqueue);
  void set_enabled(bool on);
  bool enabled() const { return enabled_; }
  void reset();
  int64_t replays() const { return replays_; }  // runs a graph served so far

 private:
  struct Entry {
    int64_t eager_runs = 0;
    cudaGraphExec_t exec = nullptr;
    bool eager_only = false;  // its capture failed
  };
  // Captures and instantiates the key's graph into `entry`; what failed, or empty.
  std::string capture(const std::string& key, cudaStream_t stream, const std::function<void()>& enqueue, Entry& entry);
  bool enabled_ = false;
  std::map<std::string, Entry> entries_;
  int64_t replays_ = 0;
};

}  // namespace engine
