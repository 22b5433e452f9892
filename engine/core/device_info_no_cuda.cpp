#include "core/device_info.h"

namespace engine {

std::string accelerator_summary() { return "CUDA: not built (CPU only; configure with -DENGINE_CUDA=ON)"; }

}  // namespace engine
