#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_distributed(Schema& schema) {
  auto section = schema.section(
      "distributed", &Recipe::distributed,
      "Training on several processes (ranks), started by mpirun or srun: data parallelism and ZeRO. Every "
      "rank reads a disjoint slice of each global batch; results are bit-identical at every stage and equal "
      "to one process accumulating the same micro-batches.");
  section.key("zero_stage", &DistributedSection::zero_stage)
      .def(0)
      .min(0)
      .limit(3)
      .help(
          "0: every rank holds the whole model and its optimizer state, gradients are reduced across ranks; "
          "1: + optimizer state (and fp32 master weights) sharded, each rank updates its shard and the "
          "parameters are all-gathered after the step; 2: + gradients sharded (reduce-scattered during the "
          "backward pass); 3: + parameters sharded, each wrap unit gathered just before use and released "
          "after.");
  section.key("wrap_policy", &DistributedSection::wrap_policy)
      .choices({{"block", WrapPolicy::block}, {"size", WrapPolicy::size}, {"model", WrapPolicy::model}})
      .def(WrapPolicy::block)
      .help(
          "How parameters are grouped into wrap units, the granularity of ZeRO-3's gathers, of gradient "
          "reductions and of activation checkpointing segments: block is one unit per transformer block (or "
          "MLP layer) plus the embeddings and the head; size groups consecutive layers up to wrap_size "
          "parameters; model is one unit for the whole model.");
  section.key("wrap_size", &DistributedSection::wrap_size)
      .def(int64_t(100'000'000))
      .min(1)
      .unit("parameters")
      .limit(int64_t(1) << 40)
      .only_when("wrap_policy", {"size"})
      .help("size: a unit holds consecutive layers up to this many parameters (a larger layer is a unit alone).");
  section.key("bucket_size", &DistributedSection::bucket_size)
      .def(int64_t(1) << 24)
      .min(1)
      .unit("gradient elements")
      .limit(int64_t(1) << 40)
      .help(
          "A wrap unit's gradient is reduced as soon as the backward pass is done with it; reductions of up "
          "to this many elements stay in flight, overlapping the rest of the backward pass, before it waits "
          "for the oldest (at least one unit is always in flight).");
  section.key("prefetch", &DistributedSection::prefetch)
      .def(1)
      .min(0)
      .limit(64)
      .unit("units")
      .help("zero_stage 3: wrap units whose gather starts ahead of the one being computed.");
  section.key("timeout", &DistributedSection::timeout)
      .def(300.0)
      .min(0.1)
      .limit(86400.0)
      .unit("seconds")
      .help(
          "A collective that does not complete in this time (a rank died or hangs) stops every rank with a "
          "message naming the operation and the ranks that did not reach it.");
  section.key("gpu_collectives", &DistributedSection::gpu_collectives)
      .choices(
          {{"auto", GpuCollectives::auto_detect}, {"nccl", GpuCollectives::nccl}, {"staged", GpuCollectives::staged}})
      .def(GpuCollectives::auto_detect)
      .help(
          "How the ranks of a GPU run without offload reduce their gradients (and, at zero_stage 3, gather "
          "their parameters), which stay on the device (docs/gpu.md): nccl runs the collectives on the GPUs, "
          "one GPU per rank; staged copies each "
          "collective's buffers to page-locked host memory and reduces them over MPI, for ranks that share a "
          "GPU (NCCL refuses two ranks on one). Both give the same bits. auto: nccl where every rank of a "
          "machine has a GPU of its own and the build has NCCL, else staged; one process reduces nothing. "
          "Naming nccl or staged on one process runs its gradient sums (and gathers) through that path anyway.");
  section.key("tensor_parallel", &DistributedSection::tensor_parallel)
      .def(1)
      .min(1)
      .limit(64)
      .unit("ranks")
      .help(
          "Tensor parallelism (Megatron-LM): each layer is split across this many consecutive ranks, attention "
          "heads and MLP columns in column-parallel matrices, the output projections row-parallel (one "
          "all-reduce each in forward and backward), the embedding and the cross-entropy over the vocabulary "
          "(the logits are never gathered whole); norms are replicated. The world size is tensor_parallel x "
          "the data-parallel ranks, over which ZeRO shards. GPT and Llama, on CPU ranks over MPI for now "
          "(docs/parallelism.md).");
  section.key("pipeline_parallel", &DistributedSection::pipeline_parallel)
      .def(1)
      .min(1)
      .limit(64)
      .unit("stages")
      .help(
          "Pipeline parallelism: the model cut into this many stages at block boundaries (balanced by the "
          "plan's FLOPs, or as pipeline_blocks says), each on its own ranks; activations and their gradients pass "
          "point to point between "
          "stages and the step's micro-batches (train.gradient_accumulation_steps) flow through them on "
          "pipeline_schedule. Each stage recomputes its forward pass in the backward (it keeps only its "
          "input per micro-batch in flight). World size = pipeline_parallel x the data-parallel ranks.");
  section.key("pipeline_schedule", &DistributedSection::pipeline_schedule)
      .choices({{"1f1b", PipelineSchedule::one_f_one_b}, {"gpipe", PipelineSchedule::gpipe}})
      .def(PipelineSchedule::one_f_one_b)
      .help(
          "1f1b: after as many forward passes as the stages after this one, each stage alternates one "
          "forward and one backward (at most pipeline_parallel micro-batches in flight); gpipe: every "
          "forward pass, then every backward pass (all micro-batches in flight). The same bits either way.");
  section.key("pipeline_blocks", &DistributedSection::pipeline_blocks)
      .def(std::vector<double>{})
      .min(1)
      .unit("blocks")
      .help(
          "The transformer blocks of each pipeline stage, first to last: pipeline_parallel whole numbers "
          "summing to model.n_layer (the embedding goes with the first stage, the head with the last). "
          "Empty: the cut whose largest stage has the fewest forward FLOPs.");
}

}  // namespace engine::recipe
