// The staged communicator's copies on a CUDA device (dist/staged_communicator.h): page-locked host
// memory and copies in the caller's stream order, each waited for before it returns.
#include <cuda_runtime.h>

#include "dist/staged_communicator.h"
#include "runtime/cuda_check.h"

namespace engine {
namespace {

class CudaCopies final : public DeviceCopies {
 public:
  explicit CudaCopies(int device) : device_(device) {}
  void* allocate_host(int64_t bytes) override {
    void* host = nullptr;
    check_cuda(cudaMallocHost(&host, size_t(bytes)), "page-locked staging (" + std::to_string(bytes) + " bytes)");
    return host;
  }
  void free_host(void* host) override { cudaFreeHost(host); }
  void download(void* host, const void* device, int64_t bytes, Stream stream) override {
    copy(host, device, bytes, cudaMemcpyDeviceToHost, stream, "download of a collective's device buffer");
    downloaded += bytes;
  }
  void upload(void* device, const void* host, int64_t bytes, Stream stream) override {
    copy(device, host, bytes, cudaMemcpyHostToDevice, stream, "upload of a collective's result");
    uploaded += bytes;
  }

 private:
  void copy(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind, Stream stream, const char* what) {
    auto* s = static_cast<cudaStream_t>(stream.handle);
    check_cuda(cudaSetDevice(device_), what);
    check_cuda(cudaMemcpyAsync(to, from, size_t(bytes), kind, s), what);
    check_cuda(cudaStreamSynchronize(s), what);
  }
  int device_;
};

}  // namespace

std::unique_ptr<DeviceCopies> make_cuda_copies(int device) { return std::make_unique<CudaCopies>(device); }

}  // namespace engine
