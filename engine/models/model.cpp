#include "models/model.h"

namespace engine {

ModelGraph build_model(const recipe::Recipe& recipe, int64_t micro_batch, double loss_scale) {
  switch (recipe.model.arch) {
    case recipe::Arch::gpt:
      return build_gpt(recipe, micro_batch, *recipe.data.sequence_length, loss_scale);
    case recipe::Arch::llama:
      return build_llama(recipe, micro_batch, *recipe.data.sequence_length, loss_scale);
    case recipe::Arch::mlp:
      return build_mlp(recipe, micro_batch, loss_scale);
  }
  return {};
}

}  // namespace engine
