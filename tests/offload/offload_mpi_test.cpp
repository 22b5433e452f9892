// Offload at world 2 under mpirun (every rank calling engine::train with the MPI communicator, each
// rank with its own swap files in one shared directory): every offload choice trains the bits of
// the same world-2 run without offload.
#include <gtest/gtest.h>

#include <sstream>

#include "../checkpoint/mpi_test_util.h"
#include "offload_util.h"

namespace engine::testing {
namespace {

class OffloadEquivalenceWorldTwo : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadEquivalenceWorldTwo, TrainsTheBitsOfNoOffload) {
  const OffloadCase c = GetParam();
  const SharedDir dir("offload_w2");
  if (comm->rank() == 0) std::filesystem::create_directories(dir / "swap");
  comm->barrier("the swap directory exists").wait();
  std::ostringstream log;
  train_here(tiny_recipe(dir / "reference", reference_overrides(c), 2), log);
  train_here(tiny_recipe(dir / "offloaded", offload_overrides(c, dir / "swap"), 2), log);
  if (comm->rank() == 0)
    expect_same_run(offload_trajectory(dir / "offloaded" / "run"), offload_trajectory(dir / "reference" / "run"),
                    "offloaded at world 2");
}

INSTANTIATE_TEST_SUITE_P(Choices, OffloadEquivalenceWorldTwo, ::testing::ValuesIn(offload_cases()), offload_case_name);

}  // namespace
}  // namespace engine::testing

ENGINE_MPI_TEST_MAIN
