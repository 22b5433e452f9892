// What the tests that run under mpirun share: the communicator every rank trains with, a scratch
// directory every rank sees, and a main() that reports from rank 0 only and fails the job when any
// rank's test fails.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <optional>

#include "../temp_dir.h"
#include "dist/communicator.h"
#include "resume_util.h"

namespace engine::testing {

inline Communicator* comm = nullptr;

// A scratch directory every rank sees: rank 0 makes it and sends its name; it is removed after
// every rank is done with it.
class SharedDir {
 public:
  explicit SharedDir(const std::string& tag) {
    std::array<char, 4096> name{};
    if (comm->rank() == 0) {
      owned_.emplace(tag);
      std::strncpy(name.data(), owned_->path().c_str(), name.size() - 1);
    }
    comm->broadcast(name.data(), int64_t(name.size()), 0, "the scratch directory's name").wait();
    path_ = name.data();
  }
  ~SharedDir() { comm->barrier("done with the scratch directory").wait(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::optional<TempDir> owned_;
  std::filesystem::path path_;
};

inline TrainSummary train_here(const recipe::LoadedRecipe& loaded, std::ostream& log, TrainOptions options = {}) {
  options.comm = comm;
  return train(loaded, log, options);
}

}  // namespace engine::testing

#define ENGINE_MPI_TEST_MAIN                                                                     \
  int main(int argc, char** argv) {                                                              \
    ::testing::InitGoogleTest(&argc, argv);                                                      \
    auto owned = engine::make_communicator(engine::CommunicatorOptions{.timeout_seconds = 120}); \
    engine::testing::comm = owned.get();                                                         \
    /* Only rank 0 reports, so the log reads as one run's. */                                    \
    if (owned->rank() != 0) {                                                                    \
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();                         \
      delete listeners.Release(listeners.default_result_printer());                              \
    }                                                                                            \
    int failed = RUN_ALL_TESTS();                                                                \
    /* A rank whose test failed fails the job: mpirun reports the highest exit status. */        \
    owned->barrier("end of tests").wait();                                                       \
    owned.reset(); /* MPI_Finalize */                                                            \
    return failed;                                                                               \
  }
