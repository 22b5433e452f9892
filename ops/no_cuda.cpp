// A build without CUDA: every CUDA kernel of ops/cuda_kernels.h fails loudly, naming its op, so a
// node asked to run on a GPU never falls back to something else. compile_step refuses run.device:
// cuda in such a build before any of these could run; they are the last line.
#include "core/error.h"
#include "cuda_kernels.h"
#include "linalg/linear_gelu.h"
#include "linalg/matmul_probe.h"

namespace engine::cuda {

#define ENGINE_NO_CUDA_KERNEL(kernel)                                                                      \
  void kernel(const Node& node, const KernelContext&) {                                                    \
    throw UserError(std::string("op ") + node.op->name +                                                   \
                    " has no CUDA kernel in this build (" #kernel "; the engine was built without CUDA)"); \
  }
ENGINE_CUDA_KERNELS(ENGINE_NO_CUDA_KERNEL)
#undef ENGINE_NO_CUDA_KERNEL

GeluProducts gelu_products() { return {}; }

double measure_matmul_flops(DType, int64_t) { throw UserError("this engine was built without CUDA: no GPU to probe"); }
double measure_copy_bandwidth(int64_t) { throw UserError("this engine was built without CUDA: no GPU to probe"); }

}  // namespace engine::cuda
