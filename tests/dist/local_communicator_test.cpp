// The size-1 communicator and the choice between it and MPI: a plain process stays local and
// never initialises MPI; the collectives over one rank are copies.
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace engine {
namespace {

// Sets (or clears, with nullopt) environment variables for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct PlainProcess {
  ScopedEnv a{"OMPI_COMM_WORLD_SIZE", std::nullopt}, b{"PMI_SIZE", std::nullopt}, c{"PMIX_RANK", std::nullopt},
      d{"PMI_RANK", std::nullopt}, e{"SLURM_STEP_NUM_TASKS", std::nullopt}, f{"SLURM_NTASKS", std::nullopt},
      g{"SLURM_NPROCS", std::nullopt};
};

TEST(LaunchedByMpi, ReadsTheLaunchersVariables) {
  PlainProcess plain;
  EXPECT_FALSE(launched_by_mpi());
  {
    ScopedEnv size("OMPI_COMM_WORLD_SIZE", "4");
    EXPECT_TRUE(launched_by_mpi());
  }
  {
    ScopedEnv size("OMPI_COMM_WORLD_SIZE", "1");  // mpirun -n 1 is a single process
    EXPECT_FALSE(launched_by_mpi());
  }
  {
    ScopedEnv size("PMI_SIZE", "2");
    EXPECT_TRUE(launched_by_mpi());
  }
  {
    ScopedEnv rank("PMIX_RANK", "0");
    EXPECT_FALSE(launched_by_mpi());  // a rank alone says nothing about the others
    ScopedEnv tasks("SLURM_STEP_NUM_TASKS", "8");
    EXPECT_TRUE(launched_by_mpi());
  }
  {
    ScopedEnv rank("PMI_RANK", "3");
    EXPECT_TRUE(launched_by_mpi());
  }
}

TEST(MakeCommunicator, APlainProcessIsLocalAndLeavesMpiAlone) {
  PlainProcess plain;
  auto comm = make_communicator(CommunicatorOptions{});
  EXPECT_EQ(comm->backend(), "local");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->local_size(), 1);
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 0);
}

TEST(LocalCommunicator, ReduceScatterCopiesOrAccumulates) {
  auto comm = make_local_communicator();
  std::vector<float> send = {1.5f, -2.0f, 1e-8f}, recv = {1.0f, 1.0f, 1.0f};
  Work w = comm->reduce_scatter(send.data(), recv.data(), 3, DType::f32, Reduction::accumulate, "grads");
  EXPECT_TRUE(w.done());
  w.wait();
  EXPECT_EQ(recv, (std::vector<float>{2.5f, -1.0f, 1.0f + 1e-8f}));
  comm->reduce_scatter(send.data(), recv.data(), 3, DType::f32, Reduction::overwrite, "grads").wait();
  EXPECT_EQ(recv, send);

  std::vector<uint16_t> send16 = {float_to_bf16(1.0f), float_to_bf16(0.00390625f)};
  std::vector<uint16_t> recv16 = {float_to_bf16(256.0f), float_to_bf16(3.0f)};
  comm->reduce_scatter(send16.data(), recv16.data(), 2, DType::bf16, Reduction::accumulate, "grads").wait();
  EXPECT_EQ(recv16[0], float_to_bf16(256.0f));  // 257 rounds back to 256 in bf16
  EXPECT_EQ(recv16[1], float_to_bf16(3.0f + 0.00390625f));
}

TEST(LocalCommunicator, AllGatherCopiesUnlessInPlace) {
  auto comm = make_local_communicator();
  std::vector<char> send = {'a', 'b', 'c'}, recv(3, 'x');
  comm->all_gather(send.data(), recv.data(), 3, "params").wait();
  EXPECT_EQ(recv, send);
  comm->all_gather(recv.data(), recv.data(), 3, "params").wait();
  EXPECT_EQ(recv, send);
}

TEST(LocalCommunicator, AllReduceBroadcastAndBarrierLeaveDataAlone) {
  auto comm = make_local_communicator();
  std::vector<float> data = {1.0f, 2.0f};
  comm->all_reduce(data.data(), 2, DType::f32, "grads").wait();
  comm->broadcast(data.data(), 8, 0, "params").wait();
  comm->barrier("step").wait();
  EXPECT_EQ(data, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(comm->bytes_sent(), 0);
  EXPECT_THROW(comm->broadcast(data.data(), 8, 1, "params"), InternalError);
}

// Any split of one rank is a group of one, with collectives of its own.
TEST(LocalCommunicator, SplitGivesAGroupOfOne) {
  auto comm = make_local_communicator();
  std::unique_ptr<Communicator> group = comm->split(3, 0, "tensor-parallel group");
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  std::vector<float> send = {5.0f}, recv = {0.0f};
  group->reduce_scatter(send.data(), recv.data(), 1, DType::f32, Reduction::overwrite, "rs").wait();
  EXPECT_EQ(recv[0], 5.0f);
}

TEST(LocalCommunicator, AbortJobEndsTheProcessWithTheCode) {
  auto comm = make_local_communicator();
  EXPECT_EXIT(comm->abort_job(3), ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace engine
