// A two-rank job whose rank 1 fails before or during a collective, for mpi_fault_test.
//
//   mpirun -n 2 mpi_fault_driver stop 2   # rank 1 stops itself (SIGSTOP) before the collective
//   mpirun -n 2 mpi_fault_driver kill 2   # rank 1 starts the collective, then SIGKILLs itself
//   mpirun -n 2 mpi_fault_driver none 2   # nobody fails
//
// Rank 0 prints when the collective started (milliseconds since the epoch) and, when it fails,
// the error and the seconds it took, then ends the job the way the engine's top level does.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist/communicator.h"

using namespace engine;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string mode = argv[1];
  auto comm = make_communicator(CommunicatorOptions{.timeout_seconds = std::atof(argv[2])});
  if (comm->size() != 2) return 2;
  std::vector<float> grads(2 * 1000, 1.0f), shard(1000);
  comm->all_reduce(grads.data(), 2 * 1000, engine::DType::f32, "warm-up").wait();  // both ranks are up

  if (comm->rank() == 1 && mode == "stop") raise(SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  if (comm->rank() == 0) {
    auto epoch =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    std::fprintf(stderr, "collective started at %lld\n", static_cast<long long>(epoch.count()));
    std::fflush(stderr);
  }
  Work work = comm->reduce_scatter(grads.data(), shard.data(), 1000, engine::DType::f32, Reduction::overwrite,
                                   "reduce-scatter of unit h.3's gradients");
  if (comm->rank() == 1 && mode == "kill") raise(SIGKILL);
  try {
    work.wait();
  } catch (const CommunicationError& error) {
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "error after %.3f s: %s\n", took.count(), error.what());
    comm->abort_job(3);
  }
  std::fprintf(stderr, "rank %d completed\n", comm->rank());
  return 0;
}
