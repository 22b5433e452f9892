// A build without CUDA has no device runner: asking for one is a user error (run.device: cuda).
#include "core/error.h"
#include "optim/device_optimizer.h"
#include "runtime/device_runner.h"

namespace engine {

std::unique_ptr<DeviceRunner> make_device_runner(const Graph&, ParameterStore&, int) {
  throw UserError(
      "run.device: cuda, but this engine was built without CUDA (configure with ENGINE_CUDA=ON on a "
      "machine with the CUDA toolkit)");
}

std::unique_ptr<DeviceOptimizer> make_device_optimizer(const recipe::OptimizerSection&, ParameterStore&, Optimizer&,
                                                       DeviceRunner&, int64_t, Communicator*) {
  throw UserError("the device optimizer needs a CUDA build");
}

}  // namespace engine
