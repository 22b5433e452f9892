// A two-rank job whose rank 1 fails before or during a collective, for mpi_fault_test.
//
//   mpirun -n 2 mpi_fault_driver stop 2   # rank 1 stops itself (SIGSTOP) before the collective
//   mpirun -n 2 mpi_fault_driver kill 2   # rank 1 starts the collective, then SIGKILLs itself
//   mpirun -n 2 mpi_fault_driver none 2   # nobody fails
//   mpirun -n 2 mpi_fault_driver group-stop 2  # as stop, in a process group whose ranks run in the
//                                               # reverse order (world rank 1 is its rank 0)
//
// Rank 0 prints when the collective started (milliseconds since the epoch) and, when it fails,
// the error and the seconds it took, then ends the job the way the engine's top level does.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

using namespace engine;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string mode = argv[1];
  auto world = make_communicator(CommunicatorOptions{.timeout_seconds = std::atof(argv[2])});
  if (world->size() != 2) return 2;
  const bool in_group = mode.rfind("group-", 0) == 0;
  std::unique_ptr<Communicator> group =
      in_group ? world->split(0, 1 - world->rank(), "tensor-parallel group") : nullptr;
  Communicator* comm = in_group ? group.get() : world.get();
  std::vector<float> grads(2 * 1000, 1.0f), shard(1000);
  comm->all_reduce(grads.data(), 2 * 1000, engine::DType::f32, "warm-up").wait();  // both ranks are up

  if (world->rank() == 1 && (mode == "stop" || mode == "group-stop")) raise(SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  if (world->rank() == 0) {
    auto epoch =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    std::fprintf(stderr, "collective started at %lld\n", static_cast<long long>(epoch.count()));
    std::fflush(stderr);
  }
  Work work = comm->reduce_scatter(grads.data(), shard.data(), 1000, engine::DType::f32, Reduction::overwrite,
                                   "reduce-scatter of unit h.3's gradients");
  if (world->rank() == 1 && mode == "kill") raise(SIGKILL);
  try {
    work.wait();
  } catch (const CommunicationError& error) {
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "error after %.3f s: %s\n", took.count(), error.what());
    world->abort_job(3);
  }
  std::fprintf(stderr, "rank %d completed\n", world->rank());
  return 0;
}
