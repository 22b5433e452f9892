#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_run(Schema& schema) {
  auto run = schema.section("run", &Recipe::run, "Identity of the run and where its outputs go.");
  run.key("name", &RunSection::name)
      .derived_default("the recipe file's name without extension")
      .file_system()
      .help("Name of the run; outputs go to <output_dir>/<name>.");
  run.key("output_dir", &RunSection::output_dir)
      .def(std::string("runs"))
      .file_system()
      .help("Directory that holds the runs, relative to the working directory.");
  run.key("seed", &RunSection::seed)
      .def(1337)
      .min(0)
      .limit((int64_t(1) << 53))
      .help("Seed of every random stream (initialisation, data order, dropout); same seed, same run.");
  run.key("device", &RunSection::device)
      .choices({{"auto", RunDevice::auto_detect}, {"cpu", RunDevice::cpu}, {"cuda", RunDevice::cuda}})
      .def(RunDevice::auto_detect)
      .help(
          "Where the step runs: cpu, cuda (the first GPU; an error where the build has no CUDA or the machine no "
          "GPU) or auto (cuda when the build has CUDA and a GPU is present, else cpu). The model state (masters, "
          "optimizer state) stays in host memory and the optimizer runs on the CPU; the forward and backward run "
          "on the device.");
}

}  // namespace engine::recipe
