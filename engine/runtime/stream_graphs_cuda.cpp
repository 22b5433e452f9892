// StreamGraphs (runtime/stream_graphs.h): capture with the CUDA runtime's stream capture.
#include "runtime/stream_graphs.h"

#include <spdlog/spdlog.h>

#include <optional>

#include "runtime/cuda_check.h"

namespace engine {

void StreamGraphs::run(const std::string& key, cudaStream_t stream, const std::function<void()>& enqueue) {
  if (!enabled_) return enqueue();
  Entry& entry = entries_[key];
  if (entry.eager_only || (!entry.exec && entry.eager_runs == 0)) {
    enqueue();  // counted once it enqueued: a first run that threw is not the eager run a capture follows
    ++entry.eager_runs;
    return;
  }
  if (!entry.exec) {
    const std::string failure = capture(key, stream, enqueue, entry);
    if (!failure.empty()) {
      // The key's work ran eagerly once already: what CUDA cannot capture (a library call that
      // synchronises, on some version of it) runs eagerly from now on, said once, rather than
      // ending the run. Nothing enqueued while capturing ran.
      spdlog::warn("{} cannot be captured as a CUDA graph ({}): it runs eagerly", key, failure);
      entry.eager_only = true;
      enqueue();
      ++entry.eager_runs;
      return;
    }
  }
  check_cuda(cudaGraphLaunch(entry.exec, stream), "graph launch of " + key);
  ++replays_;
}

std::string StreamGraphs::capture(const std::string& key, cudaStream_t stream, const std::function<void()>& enqueue,
                                  Entry& entry) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture of " + key);
  cudaGraph_t graph = nullptr;
  std::optional<std::string> thrown;  // whatever the enqueue threw ends the capture first
  try {
    enqueue();
  } catch (const std::exception& e) {
    thrown = std::string("the enqueue threw: ") + e.what();
  } catch (...) {
    thrown = "the enqueue threw";
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cudaGetLastError();  // an invalidated capture's error is this function's answer, not the next launch's
  if (thrown || ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    return thrown ? *thrown : std::string(cudaGetErrorString(ended));
  }
  cudaGraphExec_t exec = nullptr;  // kept only once instantiated: a failed one is never launched
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("instantiation: ") + cudaGetErrorString(status);
  }
  entry.exec = exec;
  return {};
}

void StreamGraphs::set_enabled(bool on) {
  enabled_ = on;
  if (!on) reset();
}

void StreamGraphs::reset() {
  for (auto& [key, entry] : entries_)
    if (entry.exec) cudaGraphExecDestroy(entry.exec);
  entries_.clear();
}

}  // namespace engine
