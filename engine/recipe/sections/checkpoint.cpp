#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_checkpoint(Schema& schema) {
  auto section = schema.section(
      "checkpoint", &Recipe::checkpoint,
      "Checkpoints: everything that determines the rest of a run (fp32 master weights, optimizer state, "
      "loss scale, step counters, data position, plugin state, the resolved recipe), each rank writing its "
      "own shard, committed atomically. A run resumed from one continues bit-identically, at any world size "
      "and ZeRO stage (docs/checkpoints.md).");
  section.key("every_steps", &CheckpointSection::every_steps)
      .def(0)
      .min(0)
      .limit(int64_t(1) << 40)
      .unit("steps")
      .help("Write a checkpoint after every this many optimizer steps (0: not by step count).");
  section.key("every_minutes", &CheckpointSection::every_minutes)
      .def(0.0)
      .min(0.0)
      .limit(525600.0)
      .unit("minutes")
      .help(
          "Write a checkpoint at the first step end after this many minutes since the last one (0: not by "
          "time). Rank 0's clock decides, so every rank saves the same step.");
  section.key("keep_last", &CheckpointSection::keep_last)
      .def(3)
      .min(0)
      .limit(int64_t(1) << 30)
      .unit("checkpoints")
      .help("Complete checkpoints kept; older ones are deleted once a newer one is committed (0: keep all).");
  section.key("dir", &CheckpointSection::dir)
      .def(std::string(""))
      .file_system()
      .help("Where checkpoints go (empty: <output_dir>/<name>/checkpoints). Every rank must see the same directory.");
  section.key("async", &CheckpointSection::async)
      .def(true)
      .help(
          "Write from a snapshot on a background thread while training continues (the snapshot, one rank's file, "
          "is host memory the plan counts); false: the step waits while its state is written straight to the file "
          "and made durable, and no snapshot memory is held (what lets a host-bound run, ZeRO-Offload's, train "
          "the largest model).");
  section.key("at_end", &CheckpointSection::at_end)
      .def(false)
      .help("Also write a checkpoint after the last step, so the run can later be extended (train.steps raised).");
  section.key("resume", &CheckpointSection::resume)
      .choices({{"never", ResumeMode::never}, {"auto", ResumeMode::auto_resume}})
      .def(ResumeMode::never)
      .help(
          "auto: continue from the latest complete checkpoint in dir when there is one (a requeued job needs no "
          "change to its command line); never: start from step 0 unless --resume is given.");
  section.key("on_error", &CheckpointSection::on_error)
      .choices({{"stop", CheckpointErrorAction::stop}, {"continue", CheckpointErrorAction::keep_training}})
      .def(CheckpointErrorAction::stop)
      .help(
          "When a checkpoint cannot be written (full disk, lost directory): stop with the error, or warn and "
          "keep training. Either way the previous checkpoint stays intact.");
  section.key("preemption_budget", &CheckpointSection::preemption_budget)
      .def(30.0)
      .min(0.0)
      .limit(86400.0)
      .unit("seconds")
      .help(
          "After SIGTERM, SIGINT or SIGUSR1 the run finishes its step and writes a checkpoint if that fits in "
          "this many seconds from the signal (else it commits the checkpoint in flight, if any), then exits "
          "with status 75 (requeue).");
}

}  // namespace engine::recipe
