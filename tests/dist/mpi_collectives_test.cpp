// The MPI communicator's collectives, run on every rank under mpirun (2 and 4 ranks), each against
// a reference the test computes itself from every rank's inputs. Values span many magnitudes, so
// a sum in any order other than rank order, or rounded other than per step, gives other bits.
//
// Every rank runs every test and issues the same collectives in the same order; checks are
// EXPECTs (never an early return) so a failing rank does not leave the others waiting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/build_flags.h"
#include "core/device_info.h"
#include "dist/communicator.h"
#include "dist/nccl_communicator.h"

namespace engine {
namespace {

Communicator* comm = nullptr;  // one per process: MPI initialises once

// Element k of the buffer `rank` contributes in test case `tag`, the same on every rank.
float value(int tag, int rank, int64_t k) {
  uint32_t h = static_cast<uint32_t>(tag) * 73856093u ^ static_cast<uint32_t>(rank) * 19349663u ^
               static_cast<uint32_t>(k) * 83492791u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  float mantissa = 1.0f + static_cast<float>(h >> 9) / static_cast<float>(1u << 23);
  return ((h & 1) ? -1.0f : 1.0f) * std::ldexp(mantissa, static_cast<int>((h >> 3) % 30) - 15);
}

// A buffer of `count` elements of dtype from `value`, as raw bytes.
std::vector<std::byte> buffer(DType dtype, int tag, int rank, int64_t count) {
  std::vector<std::byte> out(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t k = 0; k < count; ++k) {
    float v = value(tag, rank, k);
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * k, &v, 4);
    } else {
      uint16_t bits = dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(out.data() + 2 * k, &bits, 2);
    }
  }
  return out;
}

float load(DType dtype, const std::byte* at) {
  if (dtype == DType::f32) {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, at, 2);
  return dtype == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
}

void store(DType dtype, std::byte* at, float v) {
  if (dtype == DType::f32) return (void)std::memcpy(at, &v, 4);
  uint16_t bits = dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
  std::memcpy(at, &bits, 2);
}

// The reference: ((start + chunk_0) + chunk_1) + ... over `order`, each sum rounded to dtype.
std::vector<std::byte> sequential_sum(DType dtype, int tag, int64_t count, bool accumulate, int init_tag,
                                      const std::vector<int>& order) {
  const int me = comm->rank();
  const size_t es = dtype_size(dtype);
  std::vector<std::byte> out(count * es);
  std::vector<std::vector<std::byte>> sends;
  for (int r = 0; r < comm->size(); ++r) sends.push_back(buffer(dtype, tag, r, count * comm->size()));
  std::vector<std::byte> init = buffer(dtype, init_tag, me, count);
  for (int64_t k = 0; k < count; ++k) {
    bool first = !accumulate;
    float acc = first ? 0.0f : load(dtype, init.data() + k * es);
    for (int r : order) {
      float x = load(dtype, sends[r].data() + (me * count + k) * es);
      acc = first ? x : acc + x;
      if (!first) {  // round each step to dtype
        std::byte tmp[4];
        store(dtype, tmp, acc);
        acc = load(dtype, tmp);
      }
      first = false;
    }
    store(dtype, out.data() + k * es, acc);
  }
  return out;
}

std::vector<int> rank_order(bool reversed) {
  std::vector<int> order;
  for (int r = 0; r < comm->size(); ++r) order.push_back(reversed ? comm->size() - 1 - r : r);
  return order;
}

class Collectives : public ::testing::TestWithParam<DType> {};

TEST_P(Collectives, ReduceScatterIsTheRankOrderSumBitForBit) {
  const DType dtype = GetParam();
  const int64_t count = 1001;
  for (bool accumulate : {false, true}) {
    std::vector<std::byte> send = buffer(dtype, 1, comm->rank(), count * comm->size());
    std::vector<std::byte> recv = buffer(dtype, 2, comm->rank(), count);
    comm->reduce_scatter(send.data(), recv.data(), count, dtype,
                         accumulate ? Reduction::accumulate : Reduction::overwrite, "reduce-scatter test")
        .wait();
    std::vector<std::byte> expected = sequential_sum(dtype, 1, count, accumulate, 2, rank_order(false));
    EXPECT_EQ(recv, expected) << "accumulate " << accumulate;
    // The inputs can tell the orders apart (with two ranks only when accumulating: a + b = b + a).
    if (accumulate || comm->size() > 2) {
      EXPECT_NE(expected, sequential_sum(dtype, 1, count, accumulate, 2, rank_order(true)));
    }
  }
}

TEST_P(Collectives, AllReduceIsReduceScatterThenAllGather) {
  const DType dtype = GetParam();
  const int64_t count = 333 * comm->size();
  const size_t es = dtype_size(dtype);
  std::vector<std::byte> data = buffer(dtype, 3, comm->rank(), count);
  std::vector<std::byte> shard(count / comm->size() * es), gathered(count * es);
  comm->reduce_scatter(data.data(), shard.data(), count / comm->size(), dtype, Reduction::overwrite, "rs").wait();
  comm->all_gather(shard.data(), gathered.data(), static_cast<int64_t>(shard.size()), "ag").wait();
  comm->all_reduce(data.data(), count, dtype, "all-reduce test").wait();
  EXPECT_EQ(data, gathered);
  EXPECT_EQ(shard, sequential_sum(dtype, 3, count / comm->size(), false, 0, rank_order(false)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& test) { return std::string(dtype_name(test.param)); });

std::vector<char> gathered_reference(int64_t bytes) {
  std::vector<char> out;
  for (int r = 0; r < comm->size(); ++r)
    for (int64_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>(r * 31 + i));
  return out;
}

TEST(MpiCommunicator, AllGatherOutOfPlaceAndInPlace) {
  const int64_t bytes = 37;
  std::vector<char> send(bytes), recv(bytes * comm->size(), '?');
  for (int64_t i = 0; i < bytes; ++i) send[i] = static_cast<char>(comm->rank() * 31 + i);
  comm->all_gather(send.data(), recv.data(), bytes, "gather").wait();
  EXPECT_EQ(recv, gathered_reference(bytes));

  std::vector<char> in_place(bytes * comm->size(), '?');
  std::memcpy(in_place.data() + comm->rank() * bytes, send.data(), bytes);
  comm->all_gather(in_place.data() + comm->rank() * bytes, in_place.data(), bytes, "gather in place").wait();
  EXPECT_EQ(in_place, gathered_reference(bytes));
}

TEST(MpiCommunicator, BroadcastFromANonZeroRoot) {
  for (int root : {comm->size() - 1, 1}) {
    std::vector<int> data(100, -1);
    if (comm->rank() == root)
      for (int i = 0; i < 100; ++i) data[i] = root * 1000 + i;
    comm->broadcast(data.data(), 400, root, "broadcast").wait();
    for (int i = 0; i < 100; ++i) ASSERT_EQ(data[i], root * 1000 + i) << "root " << root;
  }
}

TEST(MpiCommunicator, BytesSentCountsWhatThisRankSends) {
  const int n = comm->size();
  int64_t before = comm->bytes_sent();
  std::vector<float> send(n * 10), recv(10), all(n * 10);
  comm->reduce_scatter(send.data(), recv.data(), 10, DType::f32, Reduction::overwrite, "rs").wait();
  EXPECT_EQ(comm->bytes_sent() - before, (n - 1) * 40);
  before = comm->bytes_sent();
  comm->all_gather(recv.data(), all.data(), 40, "ag").wait();
  EXPECT_EQ(comm->bytes_sent() - before, (n - 1) * 40);
  before = comm->bytes_sent();
  comm->all_reduce(all.data(), n * 10, DType::f32, "ar").wait();
  EXPECT_EQ(comm->bytes_sent() - before, 2 * (n - 1) * 40);
  before = comm->bytes_sent();
  comm->broadcast(all.data(), 40, 1, "bcast").wait();
  EXPECT_EQ(comm->bytes_sent() - before, comm->rank() == 1 ? (n - 1) * 40 : 0);
  before = comm->bytes_sent();
  comm->barrier("barrier").wait();
  EXPECT_EQ(comm->bytes_sent() - before, 0);
}

TEST(MpiCommunicator, OperationsInFlightTogetherCompleteInOrder) {
  const int n = comm->size();
  const int64_t count = 1 << 16;
  std::vector<float> grads(count * n), shard(count), params(count), gathered(count * n);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(comm->rank() + 1);
  for (int64_t i = 0; i < count; ++i) params[i] = static_cast<float>(comm->rank() * count + i);
  Work first = comm->reduce_scatter(grads.data(), shard.data(), count, DType::f32, Reduction::overwrite, "first");
  Work second = comm->all_gather(params.data(), gathered.data(), count * 4, "second");
  first.wait();
  second.wait();
  second.wait();  // waiting twice is harmless
  EXPECT_TRUE(first.done() && second.done());
  EXPECT_EQ(shard[0], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(shard[count - 1], static_cast<float>(n * (n + 1) / 2));
  for (int64_t i = 0; i < count * n; ++i) ASSERT_EQ(gathered[i], static_cast<float>(i));
}

TEST(MpiCommunicator, KnowsItsRanks) {
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_TRUE(launched_by_mpi());
  EXPECT_GE(comm->size(), 2);
  EXPECT_EQ(comm->local_size(), comm->size());  // mpirun on this one machine
  EXPECT_EQ(comm->local_rank(), comm->rank());
}

// Process groups as 3D parallelism lays them out: rows (ranks 2g, 2g + 1: a "tensor-parallel"
// pair) and columns (ranks of the same parity), with 2 ranks two rows of one. Each group's
// reduce-scatter is the rank-order sum over its members only, in the group's own rank order (set
// by the key: the columns' reversed), with both kinds of groups' collectives in flight at once and
// the world's after them.
TEST(MpiCommunicator, GroupsSplitByColourRunTheirOwnCollectives) {
  const int world = comm->size(), me = comm->rank();
  std::unique_ptr<Communicator> row = comm->split(me / 2, me, "tensor-parallel group");
  std::unique_ptr<Communicator> column = comm->split(me % 2, world - me, "data-parallel group");
  const auto members = [&](bool of_row) {  // world ranks of this rank's group, in the group's order
    std::vector<int> out;
    for (int r = 0; r < world; ++r)
      if (of_row ? r / 2 == me / 2 : r % 2 == me % 2) out.push_back(r);
    if (!of_row) std::reverse(out.begin(), out.end());
    return out;
  };
  const std::vector<int> row_members = members(true), column_members = members(false);
  ASSERT_EQ(row->size(), int(row_members.size()));
  ASSERT_EQ(column->size(), int(column_members.size()));
  EXPECT_EQ(row_members[size_t(row->rank())], me);
  EXPECT_EQ(column_members[size_t(column->rank())], me);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t count = 257;
    std::vector<std::byte> row_send = buffer(dtype, 10, me, count * row->size()), row_recv(count * dtype_size(dtype));
    std::vector<std::byte> column_send = buffer(dtype, 11, me, count * column->size()),
                           column_recv(count * dtype_size(dtype));
    Work a = row->reduce_scatter(row_send.data(), row_recv.data(), count, dtype, Reduction::overwrite, "row rs");
    Work b =
        column->reduce_scatter(column_send.data(), column_recv.data(), count, dtype, Reduction::overwrite, "column rs");
    a.wait();
    b.wait();
    // The reference: the members' chunks (their `value`s at this rank's slot in the group) summed in
    // the group's order, rounded at each step.
    const auto reference = [&](int tag, const std::vector<int>& group, int slot) {
      std::vector<std::byte> sum = buffer(dtype, tag, group[0], count * int64_t(group.size()));
      std::vector<std::byte> out(sum.begin() + slot * count * int64_t(dtype_size(dtype)),
                                 sum.begin() + (slot + 1) * count * int64_t(dtype_size(dtype)));
      for (size_t g = 1; g < group.size(); ++g) {
        const std::vector<std::byte> theirs = buffer(dtype, tag, group[g], count * int64_t(group.size()));
        add_into(out.data(), theirs.data() + slot * count * int64_t(dtype_size(dtype)), count, dtype);
      }
      return out;
    };
    EXPECT_EQ(row_recv, reference(10, row_members, row->rank())) << dtype_name(dtype);
    EXPECT_EQ(column_recv, reference(11, column_members, column->rank())) << dtype_name(dtype);
  }
  std::vector<char> ranks(static_cast<size_t>(world));
  const char mine = char(me);
  comm->all_gather(&mine, ranks.data(), 1, "world after the groups").wait();
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[size_t(r)], char(r));
  // A group of groups: each row split again by rank within it gives groups of one.
  std::unique_ptr<Communicator> single = row->split(row->rank(), 0, "pipeline-parallel group");
  EXPECT_EQ(single->size(), 1);
  row->barrier("row done").wait();
  column->barrier("column done").wait();
}

// NCCL's bootstrap over the MPI ranks, which needs no GPU: rank 0's unique id reaches every rank.
// Where there is no device, the communicator itself is refused on every rank, saying why.
TEST(NcclBootstrap, EveryRankReceivesRankZerosUniqueId) {
  if (!kHaveNccl) {
    try {
      nccl_unique_id(*comm);
      ADD_FAILURE() << "a build without NCCL made an id";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("without NCCL"), std::string::npos) << e.what();
    }
    return;
  }
  const std::string id = nccl_unique_id(*comm);
  ASSERT_EQ(id.size(), 128u);
  EXPECT_NE(id, std::string(128, '\0'));
  std::vector<char> all(id.size() * size_t(comm->size()));
  comm->all_gather(id.data(), all.data(), int64_t(id.size()), "the ids").wait();
  for (int r = 0; r < comm->size(); ++r)
    EXPECT_EQ(std::string(all.data() + size_t(r) * id.size(), id.size()), id) << "rank " << r;
  if (cuda_device_count() > comm->local_rank()) return;
  try {
    make_nccl_communicator(*comm, comm->local_rank(), CommunicatorOptions{});
    ADD_FAILURE() << "an NCCL communicator without a device";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace engine

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto owned = engine::make_communicator(engine::CommunicatorOptions{.timeout_seconds = 120});
  engine::comm = owned.get();
  int failed = RUN_ALL_TESTS();
  owned->barrier("end of tests").wait();
  owned.reset();  // MPI_Finalize
  return failed;
}
