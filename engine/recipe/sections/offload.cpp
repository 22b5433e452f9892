#include "recipe/sections/sections.h"

namespace engine::recipe {

namespace {

const std::vector<std::pair<std::string, OffloadTier>> kDevices = {
    {"none", OffloadTier::none}, {"cpu", OffloadTier::cpu}, {"nvme", OffloadTier::nvme}};

}  // namespace

void declare_offload(Schema& schema) {
  auto section = schema.section(
      "offload", &Recipe::offload,
      "Moving model state out of the memory the step computes in (ZeRO-Offload and ZeRO-Infinity): the "
      "optimizer step runs where the state lives, streamed in chunks whose transfers overlap the update. "
      "Training is bit-identical to no offload (docs/offload.md).");
  section.key("optimizer", &OffloadSection::optimizer)
      .choices(kDevices)
      .def(OffloadTier::none)
      .help(
          "Where the fp32 master weights and the optimizer state live: none (with the parameters), cpu (host "
          "memory, updated by the CPU optimizer; on a CPU run that is where they already are) or nvme (a swap "
          "file in nvme_path, streamed through memory chunk by chunk at each step). In fp32 below zero_stage 3 "
          "the master weights are the parameters the step computes with and stay in memory.");
  section.key("parameters", &OffloadSection::parameters)
      .choices(kDevices)
      .def(OffloadTier::none)
      .help(
          "zero_stage 3: where each rank's shard of the parameters (in the compute type) lives between its "
          "gathers: none, cpu, or nvme (read back ahead of each wrap unit's gather, as distributed.prefetch "
          "says).");
  section.key("nvme_path", &OffloadSection::nvme_path)
      .def(std::string(""))
      .file_system()
      .help(
          "The swap directory for nvme: it must exist, be writable and have room for what `engine plan` says "
          "the swap files hold; each rank preallocates its own files there at start and removes them at exit.");
  section.key("queue_depth", &OffloadSection::queue_depth)
      .def(8)
      .min(1)
      .limit(1024)
      .unit("requests")
      .help("nvme: I/O requests in flight per swap file (io_uring).");
  section.key("block_size", &OffloadSection::block_size)
      .def(int64_t(1) << 20)
      .min(4096)
      .limit(int64_t(1) << 30)
      .unit("bytes")
      .help("nvme: the largest single I/O request, a multiple of 4096 (direct I/O).");
  section.key("chunk_size", &OffloadSection::chunk_size)
      .def(int64_t(1) << 20)
      .min(2048)
      .limit(int64_t(1) << 34)
      .unit("parameters")
      .help(
          "The offloaded optimizer step moves state through memory this many parameters at a time (a multiple "
          "of 2048), with three chunks in memory: while one is updated the next is read and the previous "
          "written back.");
}

}  // namespace engine::recipe
