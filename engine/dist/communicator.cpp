// The backend-independent parts of the communicator: the reduction step, the launcher check and
// the factory that picks the local or the MPI implementation.
#include "dist/communicator.h"

#include <cstdlib>
#include <string>

#include "dist/local_communicator.h"
#include "dist/mpi_communicator.h"

namespace engine {

namespace {

// A launcher variable as a non-negative integer, or -1 when it is absent or malformed.
long env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  return (*end == '\0' && value >= 0) ? value : -1;
}

template <typename Load, typename Store>
void add_rounded(uint16_t* accumulator, const uint16_t* addend, int64_t count, Load load, Store store) {
  for (int64_t i = 0; i < count; ++i) accumulator[i] = store(load(accumulator[i]) + load(addend[i]));
}

}  // namespace

std::unique_ptr<Communicator> Communicator::split(int, int, const std::string& name) {
  throw UserError("the " + backend() + " communicator has no process groups (" + name +
                  "): tensor and pipeline parallelism run over MPI");
}

std::vector<double> gather_values(Communicator& comm, const std::vector<double>& values, const std::string& what) {
  if (comm.size() == 1) return values;
  std::vector<double> all(values.size() * size_t(comm.size()));
  comm.all_gather(values.data(), all.data(), int64_t(values.size() * sizeof(double)), "all-gather of " + what).wait();
  return all;
}

void add_into(void* accumulator, const void* addend, int64_t count, DType dtype) {
  switch (dtype) {
    case DType::f32: {
      float* a = static_cast<float*>(accumulator);
      const float* b = static_cast<const float*>(addend);
#pragma omp simd
      for (int64_t i = 0; i < count; ++i) a[i] += b[i];
      return;
    }
    case DType::bf16:
      add_rounded(static_cast<uint16_t*>(accumulator), static_cast<const uint16_t*>(addend), count, bf16_to_float,
                  float_to_bf16);
      return;
    case DType::f16:
      add_rounded(static_cast<uint16_t*>(accumulator), static_cast<const uint16_t*>(addend), count, f16_to_float,
                  float_to_f16);
      return;
    default:
      break;
  }
  ENGINE_CHECK(false, "reductions are defined for f32, bf16 and f16, not " + std::string(dtype_name(dtype)));
}

bool launched_by_mpi() {
  // Open MPI's mpirun says the world size outright; so do MPICH's Hydra and Slurm's PMI-1/PMI-2.
  if (long size = env_int("OMPI_COMM_WORLD_SIZE"); size >= 0) return size > 1;
  if (long size = env_int("PMI_SIZE"); size >= 0) return size > 1;
  // PMIx (srun --mpi=pmix) gives only a rank; the step's task count comes from Slurm.
  for (const char* rank_name : {"PMIX_RANK", "PMI_RANK"}) {
    long rank = env_int(rank_name);
    if (rank < 0) continue;
    for (const char* size_name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"})
      if (long size = env_int(size_name); size >= 0) return size > 1;
    return rank > 0;  // no size known: only a rank other than 0 proves there are several
  }
  return false;
}

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options) {
  if (launched_by_mpi()) return make_mpi_communicator(options);
  return make_local_communicator();
}

}  // namespace engine
