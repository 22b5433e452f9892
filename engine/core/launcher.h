// What the launcher (mpirun, srun) tells a process through its environment: its rank and the
// number of ranks. Read before MPI is initialised, so that logging can name the rank from the
// first message on.
//
//   Launch launch = launch_from_environment();   // {rank 1, world_size 4} under mpirun -n 4
#pragma once

#include <functional>

namespace engine {

// Reads an environment variable: nullptr when unset (std::getenv's contract).
using GetEnv = std::function<const char*(const char*)>;

struct Launch {
  int rank = 0;
  int world_size = 1;
};

// OMPI_COMM_WORLD_RANK/SIZE (Open MPI), else PMI_RANK/SIZE (MPICH, Slurm's PMI); a single process
// when neither pair is set or a value is not a count (the recipe loader reports a bad size).
Launch launch_from_environment(const GetEnv& getenv);
Launch launch_from_environment();

}  // namespace engine
