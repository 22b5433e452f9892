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
          "Where the step runs: cpu, cuda (a GPU per rank of the machine; an error where the build has no CUDA or "
          "the machine no GPU) or auto (cuda when the build has CUDA and a GPU is present, else cpu). On cuda a "
          "run without offload, at any ZeRO stage and world size, runs the whole step on the GPU and keeps the model "
          "state (its shard) there, reducing and gathering through its device collectives; with offload the GPU "
          "computes the forward and backward and the host reduces, updates and gathers, with the same bits. "
          "Checkpoints hold the same host record on either device, so a run resumes on the other.");
  run.key("cuda_graphs", &RunSection::cuda_graphs)
      .def(true)
      .help(
          "On cuda, capture each plan's forward and backward as a CUDA graph after its first (eager) run and replay "
          "the graph from then on: one launch per micro-batch instead of one per kernel, the same kernels and the "
          "same bits (the step's seed, counters and loss scale are read from device memory). false replays kernel "
          "by kernel. telemetry.op_table times each kernel, so it replays eagerly whatever this says.");
  run.key("fusions", &RunSection::fusions)
      .def(true)
      .help(
          "On cuda, run op pairs as one fused kernel where the GPU has one (docs/gpu.md): GPT's fc product with the "
          "GELU after it, forward (cuBLASLt's GELU_AUX_BIAS epilogue) and backward (the fc projection's input "
          "gradient with GELU's backward in its DGELU epilogue); each residual gradient read by the norm backward "
          "that adds to it; each residual add carried by the norm that reads its sum; each projection's bias "
          "gradient summed by the norm backward that writes its output gradient. The same values, one kernel "
          "and one pass over memory fewer each; cuBLASLt's GELU and bias sums round in their own order, so the "
          "bits differ from the unfused kernels' (the other norm fusions keep them). false runs every op as its own "
          "kernel. A CPU plan has no fused kernels, so on cpu this changes nothing. engine plan counts the fused "
          "nodes.");
  run.key("deterministic", &RunSection::deterministic)
      .def(true)
      .help(
          "On cuda, whether every kernel gives the same bits at every run. true (the default): only algorithms "
          "whose sums run in a fixed order, so a run repeats bit for bit and ZeRO stages and world sizes agree "
          "as on cpu. false: cuDNN's attention backward may sum the query gradient in the order its blocks finish "
          "(its faster non-deterministic algorithm, as PyTorch's attention backward does): the same values within "
          "rounding, different bits from run to run. The cpu kernels always sum in a fixed order, so on cpu this "
          "changes nothing. engine plan says which attention backward a GPU plan runs.");
}

}  // namespace engine::recipe
