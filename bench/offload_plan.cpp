// offload_plan: the plan's exact offload figures for a recipe (what `engine train` prints rounded),
// for bench/offload_step.sh to compare against the swap bytes a run measures.
//
//   build/bench/offload_plan RECIPE [OVERRIDES...]
//
// Prints one line:
//   offload_plan swap_read=... swap_written=... swap_file_bytes=... offload_buffers=... total=...
// (bytes per optimizer step of one rank; total is MemoryPlan::total(), the host memory the plan counts).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "recipe/load.h"
#include "trainer/session.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: offload_plan RECIPE [OVERRIDES...]\n");
    return 2;
  }
  try {
    engine::recipe::LoadOptions options;
    options.overrides.assign(argv + 2, argv + argc);
    const engine::recipe::LoadedRecipe loaded = engine::recipe::load_recipe(argv[1], options);
    const engine::CompiledStep c = engine::compile_step(loaded.recipe, int(loaded.world.size));
    std::printf("offload_plan swap_read=%lld swap_written=%lld swap_file_bytes=%lld offload_buffers=%lld total=%lld\n",
                static_cast<long long>(c.traffic.swap_read), static_cast<long long>(c.traffic.swap_written),
                static_cast<long long>(c.memory.swap), static_cast<long long>(c.memory.offload_buffers),
                static_cast<long long>(c.memory.total()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_plan: %s\n", e.what());
    return 2;
  }
}
