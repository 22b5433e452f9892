// The staged communicator's device copies in a build without CUDA (dist/staged_communicator.h).
#include "core/error.h"
#include "dist/staged_communicator.h"

namespace engine {

std::unique_ptr<DeviceCopies> make_cuda_copies(int /*device*/) {
  throw UserError("this engine was built without CUDA: the staged communicator's device copies need it");
}

}  // namespace engine
