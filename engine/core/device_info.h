// What accelerator support this build has, for `engine --version`.
//
// With CUDA (ENGINE_CUDA=ON or AUTO with a toolkit found), device_info_cuda.cu asks the runtime;
// without it, device_info_no_cuda.cpp says the build is CPU-only. Either way the engine runs on CPU.
#pragma once

#include <cstdint>
#include <string>

namespace engine {

// "CUDA 13.0 runtime, 1 device: NVIDIA H100 80GB HBM3 (sm_90)" / "CUDA: not built" / "... no device"
std::string accelerator_summary();

// CUDA devices the runtime sees (0 in a build without CUDA, or when the driver reports none).
int cuda_device_count();
// The name of CUDA device `index` ("NVIDIA H200"), or "" when there is none.
std::string cuda_device_name(int index);
// Its PCI bus id ("0000:19:00.0"), which names it to NVML (telemetry/gpu_sensors.h); "" when none.
std::string cuda_device_pci_bus_id(int index);
// Bytes free on CUDA device `index` now (cudaMemGetInfo: other processes' use counted), 0 when none.
int64_t cuda_device_free_bytes(int index);

}  // namespace engine
