// Model weights to and from safetensors under Hugging Face names and layouts.
//
// GPT-2's Hugging Face checkpoints store the four linear layers of a block (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights, (in, out); the engine stores every linear
// weight (out, in), so those are transposed on the way in and out. Everything else keeps its
// layout. Import checks that every parameter is present with the right shape and dtype (F32), and
// names any missing, unexpected or mis-shaped tensor; then that every value is finite, naming each
// tensor that holds a NaN or an infinity (a run from such weights diverges at its first step, far
// from the cause). It accepts Hugging Face's GPT-2 files as
// published: a "transformer." prefix, the attention-mask buffers and a tied lm_head.weight.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "graph/graph.h"
#include "recipe/recipe.h"
#include "runtime/parameters.h"

namespace engine {

void save_weights(const std::filesystem::path& path, const ParameterStore& store, recipe::Arch arch,
                  const std::map<std::string, std::string>& metadata);
void load_weights(const std::filesystem::path& path, ParameterStore& store, recipe::Arch arch);

}  // namespace engine
