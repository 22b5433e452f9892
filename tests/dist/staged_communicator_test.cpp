// The staged communicator's host logic (dist/staged_communicator.h) under mpirun, with host memory
// standing for the device (make_host_copies): every collective gives the bits of the MPI
// communicator it stages through, on the same inputs, and moves the bytes the staging says (the
// device inputs down once, the results up once). The MPI collectives themselves are checked
// against their references in mpi_collectives_test.cpp; the CUDA copies run on the GPU machine
// (tests/cuda/cuda_zero_test.cpp: two ranks sharing one GPU).
//
// Every rank runs every test and issues the same collectives in the same order; checks are
// EXPECTs (never an early return) so a failing rank does not leave the others waiting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../collective_values.h"
#include "core/dtype.h"
#include "dist/communicator.h"
#include "dist/staged_communicator.h"

namespace engine {
namespace {

Communicator* host = nullptr;  // one per process: MPI initialises once

// This rank's inputs of test case `tag` (testing::collective_values), different on every rank.
std::vector<std::byte> values(DType dtype, int tag, int64_t count) {
  return testing::collective_values(dtype, tag + 100 * host->rank(), count);
}

struct Staged {
  std::shared_ptr<DeviceCopies> copies = make_host_copies();
  std::unique_ptr<Communicator> comm = make_staged_communicator(*host, copies);
};

class StagedCollectives : public ::testing::TestWithParam<DType> {};

TEST_P(StagedCollectives, ReduceScatterIsTheHostCommunicatorsBitsThroughOneCopyEachWay) {
  const DType dtype = GetParam();
  const int64_t count = 1001, world = host->size();
  const auto chunk = int64_t(count * int64_t(dtype_size(dtype)));
  for (Reduction reduction : {Reduction::overwrite, Reduction::accumulate}) {
    Staged staged;
    const std::vector<std::byte> send = values(dtype, 1, count * world);
    std::vector<std::byte> device_send = send, device_recv = values(dtype, 2, count);
    std::vector<std::byte> expected = device_recv;
    host->reduce_scatter(send.data(), expected.data(), count, dtype, reduction, "reference").wait();
    staged.comm->reduce_scatter(device_send.data(), device_recv.data(), count, dtype, reduction, "staged").wait();
    const bool accumulate = reduction == Reduction::accumulate;
    EXPECT_EQ(device_recv, expected) << "accumulate " << accumulate;
    EXPECT_EQ(device_send, send) << "the send buffer is read, not written";
    // The inputs down once (and the shard's running sum when accumulating), the shard up once.
    EXPECT_EQ(staged.copies->downloaded, chunk * world + (accumulate ? chunk : 0));
    EXPECT_EQ(staged.copies->uploaded, chunk);
    EXPECT_EQ(staged.comm->bytes_sent(), chunk * (world - 1)) << "what the host collective sent";
  }
}

TEST_P(StagedCollectives, AllReduceIsTheHostCommunicatorsBits) {
  const DType dtype = GetParam();
  const int64_t count = 333 * host->size();
  Staged staged;
  std::vector<std::byte> expected = values(dtype, 3, count), device = expected;
  host->all_reduce(expected.data(), count, dtype, "reference").wait();
  staged.comm->all_reduce(device.data(), count, dtype, "staged").wait();
  EXPECT_EQ(device, expected);
  EXPECT_EQ(staged.copies->downloaded, int64_t(device.size()));
  EXPECT_EQ(staged.copies->uploaded, int64_t(device.size()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, StagedCollectives, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& test) { return std::string(dtype_name(test.param)); });

TEST(StagedCommunicator, AllGatherOutOfPlaceAndInPlace) {
  const int64_t bytes = 37, world = host->size(), rank = host->rank();
  std::vector<char> mine(bytes), expected(size_t(bytes * world));
  for (int64_t i = 0; i < bytes; ++i) mine[size_t(i)] = char(rank * 31 + i);
  for (int64_t r = 0; r < world; ++r)
    for (int64_t i = 0; i < bytes; ++i) expected[size_t(r * bytes + i)] = char(r * 31 + i);
  Staged staged;
  std::vector<char> out(expected.size(), '?');
  staged.comm->all_gather(mine.data(), out.data(), bytes, "gather").wait();
  EXPECT_EQ(out, expected);
  std::vector<char> in_place(expected.size(), '?');
  std::memcpy(in_place.data() + rank * bytes, mine.data(), size_t(bytes));
  staged.comm->all_gather(in_place.data() + rank * bytes, in_place.data(), bytes, "gather in place").wait();
  EXPECT_EQ(in_place, expected);
  // This rank's bytes down, the whole buffer up, each time.
  EXPECT_EQ(staged.copies->downloaded, 2 * bytes);
  EXPECT_EQ(staged.copies->uploaded, 2 * bytes * world);
}

TEST(StagedCommunicator, BroadcastFromANonZeroRootMovesOnlyWhatEachSideNeeds) {
  const int root = host->size() - 1;
  Staged staged;
  std::vector<int> data(100, -1);
  if (host->rank() == root)
    for (int i = 0; i < 100; ++i) data[size_t(i)] = i * 7;
  staged.comm->broadcast(data.data(), 400, root, "broadcast").wait();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(data[size_t(i)], i * 7);
  const bool is_root = host->rank() == root;
  EXPECT_EQ(staged.copies->downloaded, is_root ? 400 : 0);
  EXPECT_EQ(staged.copies->uploaded, is_root ? 0 : 400);
}

TEST(StagedCommunicator, KnowsItsRanksAndSaysWhatItStagesThrough) {
  Staged staged;
  EXPECT_EQ(staged.comm->rank(), host->rank());
  EXPECT_EQ(staged.comm->size(), host->size());
  EXPECT_EQ(staged.comm->local_rank(), host->local_rank());
  EXPECT_EQ(staged.comm->backend(), "staged over " + host->backend());
}

// A group split from a staged communicator stages its own collectives the same way.
TEST(StagedCommunicator, GroupsSplitFromItAreStagedToo) {
  Staged staged;
  std::unique_ptr<Communicator> pairs = staged.comm->split(host->rank() / 2, host->rank(), "pairs");
  EXPECT_EQ(pairs->backend(), staged.comm->backend());
  std::vector<float> data = {float(host->rank() + 1)};
  std::vector<float> both(size_t(pairs->size()));
  pairs->all_gather(data.data(), both.data(), 4, "the pair's values").wait();
  for (int r = 0; r < pairs->size(); ++r) EXPECT_EQ(both[size_t(r)], float(host->rank() / 2 * 2 + r + 1));
  EXPECT_EQ(staged.copies->downloaded, 4) << "the group's gather went through the same copies";
  pairs->barrier("pairs done").wait();
}

}  // namespace
}  // namespace engine

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto owned = engine::make_communicator(engine::CommunicatorOptions{.timeout_seconds = 120});
  engine::host = owned.get();
  int failed = RUN_ALL_TESTS();
  owned->barrier("end of tests").wait();
  owned.reset();  // MPI_Finalize
  return failed;
}
