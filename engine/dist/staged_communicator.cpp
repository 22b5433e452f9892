// The staged communicator (dist/staged_communicator.h): device buffers through host staging.
#include "dist/staged_communicator.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace engine {
namespace {

// Host memory standing for the device's.
class HostCopies final : public DeviceCopies {
 public:
  void* allocate_host(int64_t bytes) override { return ::operator new(size_t(bytes)); }
  void free_host(void* host) override { ::operator delete(host); }
  void download(void* host, const void* device, int64_t bytes, Stream /*stream*/) override {
    std::memcpy(host, device, size_t(bytes));
    downloaded += bytes;
  }
  void upload(void* device, const void* host, int64_t bytes, Stream /*stream*/) override {
    std::memcpy(device, host, size_t(bytes));
    uploaded += bytes;
  }
};

// A host buffer of the copies' kind, grown as a collective needs (never while in use: every
// collective is complete when it returns).
class StagingBuffer {
 public:
  explicit StagingBuffer(DeviceCopies& copies) : copies_(copies) {}
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() {
    if (data_) copies_.free_host(data_);
  }
  std::byte* get(int64_t bytes) {
    if (bytes > bytes_) {
      if (data_) copies_.free_host(data_);
      data_ = nullptr;  // empty, should the allocation throw
      bytes_ = 0;
      data_ = static_cast<std::byte*>(copies_.allocate_host(bytes));
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  DeviceCopies& copies_;
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Communicator& host, std::shared_ptr<DeviceCopies> copies,
                     std::unique_ptr<Communicator> owned = nullptr)
      : owned_(std::move(owned)), host_(host), copies_(std::move(copies)), send_(*copies_), recv_(*copies_) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int local_rank() const override { return host_.local_rank(); }
  int local_size() const override { return host_.local_size(); }
  std::string backend() const override { return "staged over " + host_.backend(); }

  Work reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction, std::string what,
                      Stream stream) override {
    const int64_t chunk = count * int64_t(dtype_size(dtype));
    std::byte* host_send = send_.get(chunk * size());
    std::byte* host_recv = recv_.get(chunk);
    copies_->download(host_send, send, chunk * size(), stream);
    if (reduction == Reduction::accumulate) copies_->download(host_recv, recv, chunk, stream);
    counted([&] { host_.reduce_scatter(host_send, host_recv, count, dtype, reduction, std::move(what)).wait(); });
    copies_->upload(recv, host_recv, chunk, stream);
    return Work();
  }

  Work all_gather(const void* send, void* recv, int64_t bytes, std::string what, Stream stream) override {
    std::byte* whole = recv_.get(bytes * size());
    std::byte* mine = whole + int64_t(rank()) * bytes;
    copies_->download(mine, send, bytes, stream);
    counted([&] { host_.all_gather(mine, whole, bytes, std::move(what)).wait(); });
    copies_->upload(recv, whole, bytes * size(), stream);
    return Work();
  }

  Work all_reduce(void* data, int64_t count, DType dtype, std::string what, Stream stream) override {
    const int64_t bytes = count * int64_t(dtype_size(dtype));
    std::byte* host_data = recv_.get(bytes);
    copies_->download(host_data, data, bytes, stream);
    counted([&] { host_.all_reduce(host_data, count, dtype, std::move(what)).wait(); });
    copies_->upload(data, host_data, bytes, stream);
    return Work();
  }

  Work broadcast(void* data, int64_t bytes, int root, std::string what, Stream stream) override {
    std::byte* host_data = recv_.get(bytes);
    if (rank() == root) copies_->download(host_data, data, bytes, stream);
    counted([&] { host_.broadcast(host_data, bytes, root, std::move(what)).wait(); });
    if (rank() != root) copies_->upload(data, host_data, bytes, stream);
    return Work();
  }

  Work barrier(std::string what) override { return host_.barrier(std::move(what)); }
  int64_t bytes_sent() const override { return bytes_sent_; }

  std::unique_ptr<Communicator> split(int colour, int key, const std::string& name) override {
    std::unique_ptr<Communicator> group = host_.split(colour, key, name);
    Communicator& host = *group;
    return std::make_unique<StagedCommunicator>(host, copies_, std::move(group));
  }

  [[noreturn]] void abort_job(int exit_code) override {
    host_.abort_job(exit_code);
    std::abort();  // abort_job does not return; the attribute does not travel through the reference
  }

 private:
  // Runs a host collective, counting what it sent as this communicator's.
  template <class Collective>
  void counted(Collective collective) {
    const int64_t before = host_.bytes_sent();
    collective();
    bytes_sent_ += host_.bytes_sent() - before;
  }

  std::unique_ptr<Communicator> owned_;  // a group split from another staged communicator's host
  Communicator& host_;
  std::shared_ptr<DeviceCopies> copies_;
  StagingBuffer send_, recv_;
  int64_t bytes_sent_ = 0;
};

}  // namespace

std::unique_ptr<DeviceCopies> make_host_copies() { return std::make_unique<HostCopies>(); }

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, std::shared_ptr<DeviceCopies> copies) {
  ENGINE_CHECK(copies != nullptr, "a staged communicator needs its device copies");
  return std::make_unique<StagedCommunicator>(host, std::move(copies));
}

}  // namespace engine
