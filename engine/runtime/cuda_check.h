// check_cuda: a CUDA runtime call's failure as an InternalError naming what was being done, for the
// host code of the device runner, the device optimizer and their graphs. CUDA builds only.
//
//   check_cuda(cudaStreamSynchronize(stream), "step of plan train");
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace engine {

// The runtime's last error is cleared first, so that a caught failure is not reported again by
// the next kernel launch's check (check_launch reads it).
inline void check_cuda(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw InternalError("CUDA " + what + ": " + cudaGetErrorString(status));
}

}  // namespace engine
