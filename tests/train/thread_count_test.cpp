// A run's result does not depend on how many threads compute it: the same recipe trained by the
// real binary at 1, 2, 3 and 5 OpenMP threads writes the same weights file, byte for byte, in fp32
// and bf16, on this CPU's own kernels and with every kernel held to AVX2 (ONEDNN_MAX_CPU_ISA caps
// oneDNN's and the engine's alike), where oneDNN's GEMM splits a long sum between threads. On a CPU
// whose kernels are AVX2 already (kernel_isa()), the capped runs would repeat the first ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/cpu_isa.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ThreadCount, TheSameWeightsAtEveryThreadCount) {
  const testing::TempDir scratch("threads");
  std::vector<const char*> isas = {""};
  if (kernel_isa() != CpuIsa::avx2) isas.push_back("AVX2");
  for (const char* isa : isas)
    for (const char* mode : {"fp32", "bf16"}) {
      std::string first;
      for (int threads : {1, 2, 3, 5}) {
        const fs::path out = scratch / (std::string(mode) + "-" + isa + "-" + std::to_string(threads));
        std::string command = std::string(*isa ? "ONEDNN_MAX_CPU_ISA=" + std::string(isa) + " " : "") +
                              "OMP_NUM_THREADS=" + std::to_string(threads) + " '" ENGINE_BINARY "' train '" +
                              ENGINE_SOURCE_DIR "/recipes/quickstart.yaml' run.output_dir=" + out.string() +
                              " precision.mode=" + mode +
                              " train.steps=30 train.micro_batch_size=8 train.gradient_accumulation_steps=2"
                              " train.eval_every=0 telemetry.tensorboard=false > '" +
                              (out.string() + ".log") + "' 2>&1";
        fs::create_directories(out.parent_path());
        ASSERT_EQ(std::system(command.c_str()), 0) << command;
        const std::string weights = read_bytes(out / "quickstart" / "model.safetensors");
        ASSERT_FALSE(weights.empty());
        if (first.empty())
          first = weights;
        else
          EXPECT_TRUE(weights == first) << mode << (*isa ? " capped at " : "") << isa << ": " << threads
                                        << " threads write other weights than 1 thread";
      }
    }
}

}  // namespace
}  // namespace engine
