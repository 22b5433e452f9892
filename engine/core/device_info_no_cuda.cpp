#include "core/device_info.h"

namespace engine {

std::string accelerator_summary() { return "CUDA: not built (CPU only; configure with -DENGINE_CUDA=ON)"; }

int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return ""; }
int64_t cuda_device_free_bytes(int) { return 0; }
std::string cuda_device_pci_bus_id(int) { return ""; }

}  // namespace engine
