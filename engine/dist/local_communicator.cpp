// The size-1 communicator: collectives reduce to copies (see local_communicator.h).
#include "dist/local_communicator.h"

#include <cstdlib>
#include <cstring>

namespace engine {

Work LocalCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction,
                                       std::string what, Stream) {
  ENGINE_CHECK(is_floating(dtype), what + ": reductions take f32, bf16 or f16");
  if (reduction == Reduction::accumulate)
    add_into(recv, send, count, dtype);
  else
    std::memcpy(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
  return Work{};
}

Work LocalCommunicator::all_gather(const void* send, void* recv, int64_t bytes, std::string, Stream) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes));
  return Work{};
}

Work LocalCommunicator::all_reduce(void*, int64_t, DType dtype, std::string what, Stream) {
  ENGINE_CHECK(is_floating(dtype), what + ": reductions take f32, bf16 or f16");
  return Work{};
}

Work LocalCommunicator::broadcast(void*, int64_t, int root, std::string what, Stream) {
  ENGINE_CHECK(root == 0, what + ": broadcast root " + std::to_string(root) + " in a group of one");
  return Work{};
}

Work LocalCommunicator::barrier(std::string) { return Work{}; }

void LocalCommunicator::abort_job(int exit_code) { std::exit(exit_code); }

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace engine
