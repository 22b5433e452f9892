// Pipeline stages: a whole model's forward graph cut at block boundaries into the graph of one stage
// (pipeline parallelism, docs/parallelism.md). A graph pass, so that `engine plan` sees each stage.
//
// Stage s holds the wrap units [boundaries[s], boundaries[s + 1]) (the embeddings with the first
// blocks, blocks, the last blocks with the head), chosen so that the largest stage's forward FLOPs
// are the least possible. Its graph is the whole graph's nodes of those units, op for op (attributes,
// dropout salts and names kept), with
//   - after the first stage, the activation the stage before hands on as an fp32 input
//     (`received`, ops/parallel/pipeline.h stage_input);
//   - before the last stage, the activation it hands on as an fp32 output whose gradient comes back
//     as an input (`sent`, `sent_gradient`, stage_output: the stage's loss);
//   - every weight drawn where the whole model draws it (Param::init_position);
//   - a weight two stages read (the embedding a tied LM head reads) in a unit of its own on both,
//     `tied.<name>`, whose gradients the two stages sum after the backward.
//
//   const std::vector<int> cuts = stage_boundaries(whole.graph, 2);
//   ModelGraph stage = cut_stage(whole, 1, cuts);   // the last blocks and the head
#pragma once

#include <string>
#include <vector>

#include "models/model.h"

namespace engine {

// The stages a step is cut into and this rank's (one stage: the whole model).
struct PipelineLayout {
  int stages = 1;
  int stage = 0;
};

// The first unit of each stage, and the units' count last (stages + 1 entries).
std::vector<int> stage_boundaries(const Graph& whole, int stages);

ModelGraph cut_stage(const ModelGraph& whole, int stage, const std::vector<int>& boundaries);
// The boundaries every rank of a run cuts at: distributed.pipeline_blocks', or balanced over the
// model as a rank of a `tensor_parallel` group holds it (its FLOPs are what a stage's rank computes), at micro-batch 1, so
// that a rank that cuts another build of the model (unsplit, to name the weights whole) cuts the
// units its stage's ranks train.
std::vector<int> pipeline_boundaries(const recipe::Recipe& recipe, int stages, int tensor_parallel);

// Every stage's graph, in stage order (what a rank that computes one stage needs to describe them all).
std::vector<ModelGraph> cut_stages(const ModelGraph& whole, const std::vector<int>& boundaries);

// The unit prefix of weights two stages share (cut_stage).
inline const std::string kTiedUnitPrefix = "tied.";

}  // namespace engine
