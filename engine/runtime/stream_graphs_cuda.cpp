// StreamGraphs (runtime/stream_graphs.h): capture with the CUDA runtime's stream capture.
#include "runtime/stream_graphs.h"

#include "runtime/cuda_check.h"

namespace engine {

void StreamGraphs::run(const std::string& key, cudaStream_t stream, const std::function<void()>& enqueue) {
  if (!enabled_) return enqueue();
  Entry& entry = entries_[key];
  if (!entry.exec && entry.eager_runs == 0) {
    enqueue();  // counted once it enqueued: a first run that threw is not the eager run a capture follows
    ++entry.eager_runs;
    return;
  }
  if (!entry.exec) {
    // Nothing runs while capturing; the launch below runs what was captured.
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture of " + key);
    cudaGraph_t graph = nullptr;
    try {
      enqueue();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph), "capture of " + key);
    cudaGraphExec_t exec = nullptr;  // kept only once instantiated: a failed one is never launched
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(status, "graph of " + key);
    entry.exec = exec;
  }
  check_cuda(cudaGraphLaunch(entry.exec, stream), "graph launch of " + key);
  ++replays_;
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
