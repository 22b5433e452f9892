// run.device resolved against the build and the machine (trainer/device.h), on any machine: the
// answers differ where a GPU is present, and each test says which it checks.
#include <gtest/gtest.h>

#include "../equivalence/run_util.h"
#include "core/device_info.h"
#include "recipe/diagnostic.h"
#include "trainer/device.h"

namespace engine::testing {
namespace {

TEST(DeviceSelection, CpuIsAlwaysTheCpu) {
  EXPECT_EQ(resolve_device(quickstart({"run.device=cpu"}).recipe, 1).kind, Device::Kind::cpu);
}

TEST(DeviceSelection, AutoIsTheGpuOnlyWhereOneIsPresent) {
  const Device d = resolve_device(quickstart({}).recipe, 1);
  EXPECT_EQ(d.kind, cuda_device_count() > 0 ? Device::Kind::cuda : Device::Kind::cpu);
}

TEST(DeviceSelection, AutoSaysWhyAPresentGpuGoesUnused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here: auto is the CPU without a word";
  std::string note;
  const Device d = resolve_device(quickstart({}).recipe, 2, &note);
  EXPECT_EQ(d.kind, Device::Kind::cpu);
  EXPECT_NE(note.find("2 ranks"), std::string::npos) << note;
}

TEST(DeviceSelection, CudaWithoutADeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: run.device cuda is valid here";
  try {
    resolve_device(quickstart({"run.device=cuda"}).recipe, 1);
    FAIL() << "resolved";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("run.device: cuda"), std::string::npos) << e.what();
  }
  // A session is refused before it allocates anything.
  EXPECT_THROW(Session(quickstart({"run.device=cuda"}).recipe), UserError);
}

TEST(DeviceSelection, CudaWithWhatTheGpuPathLacksIsARecipeError) {
  try {
    quickstart({"run.device=cuda", "distributed.zero_stage=2"});
    FAIL() << "loaded";
  } catch (const recipe::RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("run.device cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zero_stage"), std::string::npos) << e.what();
  }
}

TEST(DeviceSelection, NamesTheDevice) {
  EXPECT_EQ(describe_device(Device{}), "cpu");
  EXPECT_EQ(describe_device(Device{Device::Kind::cuda, 0}).rfind("cuda:0 (", 0), 0u);
}

}  // namespace
}  // namespace engine::testing
