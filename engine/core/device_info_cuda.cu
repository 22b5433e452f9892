#include <cuda_runtime.h>

#include "core/device_info.h"
#include "nn/attention_cudnn.h"

namespace engine {

namespace {

// "; cuDNN SDPA: yes (cuDNN 9.19.0 loaded, ...)" or "; cuDNN SDPA: no (why)": 16-bit attention on
// cuDNN's fused SDPA, or all of it on the engine's own kernels.
std::string cudnn_summary() {
#if defined(ENGINE_HAVE_CUDNN) && ENGINE_HAVE_CUDNN
  return "; cuDNN SDPA: " + cuda::cudnn_attention_summary();
#elif defined(ENGINE_CUDNN_MISSING)
  return std::string("; cuDNN SDPA: no (") + ENGINE_CUDNN_MISSING + "; the engine's kernels do all attention)";
#else
  return "; cuDNN SDPA: no (not built with cuDNN; the engine's kernels do all attention)";
#endif
}

}  // namespace

std::string accelerator_summary() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string out = "CUDA " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + " runtime";
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return out + ", no device (" + (status != cudaSuccess ? cudaGetErrorString(status) : "none found") + ")" +
           cudnn_summary();
  }
  out += ", " + std::to_string(count) + (count == 1 ? " device" : " devices");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out += std::string(i ? "; " : ": ") + prop.name + " (sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ")";
  }
  return out + cudnn_summary();
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (index >= cuda_device_count() || cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "";
  return prop.name;
}

std::string cuda_device_pci_bus_id(int index) {
  char id[32] = {};
  if (index >= cuda_device_count() || cudaDeviceGetPCIBusId(id, int(sizeof(id)), index) != cudaSuccess) return "";
  return id;
}

int64_t cuda_device_free_bytes(int index) {
  if (index >= cuda_device_count() || cudaSetDevice(index) != cudaSuccess) return 0;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return int64_t(free);
}

}  // namespace engine
