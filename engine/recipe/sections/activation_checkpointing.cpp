#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_activation_checkpointing(Schema& schema) {
  auto section = schema.section(
      "activation_checkpointing", &Recipe::activation_checkpointing,
      "Trading compute for activation memory: some forward activations are not kept for the backward but "
      "recomputed just before it. A graph pass before planning, so `engine plan` shows each policy's "
      "activation memory and extra FLOPs; results are bit-identical to policy none.");
  section.key("policy", &ActivationCheckpointingSection::policy)
      .choices({{"none", CheckpointPolicy::none},
                {"full", CheckpointPolicy::full},
                {"every_k", CheckpointPolicy::every_k},
                {"selective", CheckpointPolicy::selective}})
      .def(CheckpointPolicy::none)
      .help(
          "none keeps every activation; full keeps only each transformer block's (or MLP layer's) input and "
          "recomputes the block before its backward; every_k does that for every k-th block; selective "
          "keeps matmul outputs and recomputes the cheap, memory-heavy ops from them (normalisations, "
          "activation functions, rotary embeddings, dropout).");
  section.key("k", &ActivationCheckpointingSection::k)
      .def(2)
      .min(1)
      .limit(1 << 20)
      .only_when("policy", {"every_k"})
      .help("every_k: blocks 0, k, 2k, ... are checkpointed.");
  section.key("cpu_checkpointing", &ActivationCheckpointingSection::cpu_checkpointing)
      .def(false)
      .only_when("policy", {"full", "every_k"})
      .help(
          "Move each checkpointed block's kept input out of the activation arena into host memory after "
          "the forward, and prefetch it back one block before its recompute.");
}

}  // namespace engine::recipe
