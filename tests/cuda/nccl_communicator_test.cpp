// The NCCL communicator on one GPU (world 1: NCCL refuses two ranks on one device), each collective
// against the host's arithmetic (add_into, the MPI communicator's reference) on device buffers, and
// ordered against a caller's stream. Several ranks are covered by its bootstrap under mpirun
// (tests/dist/mpi_collectives_test.cpp) and by the staged runs that share one GPU
// (cuda_zero_test.cpp). Skipped, saying so, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "../collective_values.h"
#include "core/device_info.h"
#include "dist/nccl_communicator.h"
#include "require_cuda_device.h"

namespace engine {
namespace {

std::vector<std::byte> values(DType dtype, int tag, int64_t count) {
  return testing::collective_values(dtype, tag, count);
}

// A device copy of host bytes, freed with it.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<std::byte>& host) : bytes_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(data_); }
  void* data() const { return data_; }
  std::vector<std::byte> host() const {
    std::vector<std::byte> out(bytes_);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    bootstrap_ = make_local_communicator();
    comm_ = make_nccl_communicator(*bootstrap_, 0, CommunicatorOptions{.timeout_seconds = 60});
  }
  std::unique_ptr<Communicator> bootstrap_, comm_;
};

TEST_F(NcclCommunicatorTest, ReduceScatterOverwritesAndAccumulatesWithTheHostsRounding) {
  EXPECT_EQ(comm_->backend(), "nccl");
  const int64_t count = 5000;  // not a multiple of any vector width
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<std::byte> send = values(dtype, 1, count), start = values(dtype, 2, count);
    DeviceBytes device_send(send), device_recv(start);
    comm_->reduce_scatter(device_send.data(), device_recv.data(), count, dtype, Reduction::overwrite, "overwrite")
        .wait();
    EXPECT_EQ(device_recv.host(), send) << dtype_name(dtype) << ": one rank's sum is its own chunk";
    comm_->reduce_scatter(device_send.data(), device_recv.data(), count, dtype, Reduction::accumulate, "accumulate")
        .wait();
    std::vector<std::byte> want = send;
    add_into(want.data(), send.data(), count, dtype);
    EXPECT_EQ(device_recv.host(), want) << dtype_name(dtype) << ": recv + chunk, rounded as add_into rounds";
  }
}

TEST_F(NcclCommunicatorTest, GatherReduceAndBroadcastKeepTheBytes) {
  const std::vector<std::byte> data = values(DType::bf16, 3, 4096);
  DeviceBytes a(data), b(std::vector<std::byte>(data.size()));
  comm_->all_gather(a.data(), b.data(), int64_t(data.size()), "all-gather").wait();
  EXPECT_EQ(b.host(), data);
  comm_->all_gather(a.data(), a.data(), int64_t(data.size()), "in place").wait();
  EXPECT_EQ(a.host(), data);
  comm_->all_reduce(a.data(), 4096, DType::bf16, "all-reduce").wait();
  EXPECT_EQ(a.host(), data);
  comm_->broadcast(a.data(), int64_t(data.size()), 0, "broadcast").wait();
  EXPECT_EQ(a.host(), data);
  EXPECT_EQ(comm_->bytes_sent(), 0) << "one rank sends nothing";
}

// A collective runs after the caller's stream's earlier work, and wait_on orders the caller's later
// work after it, without the host waiting in between.
TEST_F(NcclCommunicatorTest, CollectivesAreOrderedAgainstTheCallersStream) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t count = int64_t(1) << 22;
  const std::vector<std::byte> data = values(DType::f32, 4, count);
  DeviceBytes source(std::vector<std::byte>(data.size())), shard(std::vector<std::byte>(data.size())),
      after(std::vector<std::byte>(data.size()));
  std::vector<std::byte> pinned_copy = data;
  ASSERT_EQ(cudaHostRegister(pinned_copy.data(), pinned_copy.size(), cudaHostRegisterDefault), cudaSuccess);
  // The caller's stream writes the source; the reduce-scatter must read it after that write. The
  // stream is held 100 ms first (a host function on it), so that a collective that did not wait for
  // the stream would run long before the write, whatever the host's own delays.
  ASSERT_EQ(cudaLaunchHostFunc(
                stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(source.data(), pinned_copy.data(), data.size(), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  Work work = comm_->reduce_scatter(source.data(), shard.data(), count, DType::f32, Reduction::overwrite,
                                    "ordered reduce-scatter", Stream{stream});
  work.wait_on(Stream{stream});
  // ... and the caller's next copy reads the shard after the reduce-scatter wrote it.
  ASSERT_EQ(cudaMemcpyAsync(after.data(), shard.data(), data.size(), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(work.done());
  EXPECT_EQ(after.host(), data);
  cudaHostUnregister(pinned_copy.data());
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace engine
