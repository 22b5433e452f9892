// dump_batches: the training micro-batches of a classification recipe, exactly as `engine train`
// reads them (the same dataset and BatchLoader), written to a safetensors file for parity.py.
// The classification source draws its samples from the engine's counter-based random streams,
// which a reference implementation cannot regenerate; reading them from here keeps the
// comparison about the model and the optimizer, on the same batches.
//
//   dump_batches RECIPE COUNT OUT.safetensors
//     inputs:  f32 (COUNT, micro_batch_size, input_dim)
//     targets: f32 (COUNT, micro_batch_size)  class indices (exact in f32)
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "data/loader.h"
#include "recipe/load.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: dump_batches RECIPE COUNT OUT.safetensors\n";
    return 2;
  }
  try {
    const engine::recipe::LoadedRecipe loaded = engine::recipe::load_recipe(argv[1]);
    const engine::recipe::Recipe& r = loaded.recipe;
    if (r.model.arch != engine::recipe::Arch::mlp) throw engine::UserError("dump_batches reads classification data");
    const int64_t count = std::atoll(argv[2]), batch = *r.train.micro_batch_size, features = r.model.input_dim;
    auto data = engine::make_dataset(r);
    engine::BatchLoader loader(*data, batch, 1, 0);
    std::vector<float> inputs, targets;
    for (int64_t i = 0; i < count; ++i) {
      engine::Batch b = loader.next();
      inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
      for (int32_t t : b.targets) targets.push_back(float(t));
    }
    auto tensor = [](const char* name, std::vector<int64_t> shape, const std::vector<float>& values) {
      engine::SafeTensor t{name, engine::DType::f32, std::move(shape), std::vector<std::byte>(values.size() * 4)};
      std::memcpy(t.data.data(), values.data(), t.data.size());
      return t;
    };
    engine::write_safetensors(
        argv[3], {tensor("inputs", {count, batch, features}, inputs), tensor("targets", {count, batch}, targets)}, {});
  } catch (const std::exception& e) {
    std::cerr << "dump_batches: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
