#include <cuda_runtime.h>

#include "core/device_info.h"

namespace engine {

std::string accelerator_summary() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string out = "CUDA " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + " runtime";
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return out + ", no device (" + (status != cudaSuccess ? cudaGetErrorString(status) : "none found") + ")";
  }
  out += ", " + std::to_string(count) + (count == 1 ? " device" : " devices");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out += std::string(i ? "; " : ": ") + prop.name + " (sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ")";
  }
  return out;
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

}  // namespace engine
