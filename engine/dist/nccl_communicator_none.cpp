// The NCCL communicator in a build without NCCL (dist/nccl_communicator.h): says why there is none.
#include "core/build_flags.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace engine {

namespace {

[[noreturn]] void no_nccl() {
  throw UserError(std::string("this engine was built without NCCL (") + kNcclMissing +
                  "): GPU collectives need a build with CUDA and NCCL");
}

}  // namespace

std::string nccl_unique_id(Communicator& /*bootstrap*/) { no_nccl(); }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& /*bootstrap*/, int /*device*/,
                                                     const CommunicatorOptions& /*options*/) {
  no_nccl();
}

}  // namespace engine
