// train: the training loop of `engine train`.
//
// Each optimizer step zeroes the gradients, runs gradient_accumulation_steps micro-batches (each
// forward + backward, gradients accumulating), clips by global norm, sets the scheduled learning
// rate and applies the optimizer. Every log_every steps it records a metrics line; every
// eval_every steps it measures the validation loss. Outputs go to <output_dir>/<name>/:
//   recipe.yaml        the resolved recipe (what `engine config` prints)
//   metrics.jsonl      one JSON object per logged step and evaluation
//   model.safetensors  the final weights (Hugging Face names), written atomically
//   summary.json       final losses, the planned memory and the measured peak resident memory
//   checkpoints/       step-N checkpoints (checkpoint section; checkpoint/checkpointer.h)
// SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 preempt: the run finishes its step, writes a checkpoint within
// checkpoint.preemption_budget and stops (the command exits with kExitRequeue); a second signal
// exits at once, leaving the checkpoints already committed.
// Under a launcher every rank runs this with its communicator; rank 0 alone writes the outputs,
// and summary.json adds the world size, the ZeRO stage, the bytes each rank sent per step
// (measured and planned) and every rank's peak resident memory.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <map>

#include "dist/communicator.h"
#include "recipe/load.h"

namespace engine {

struct TrainSummary {
  std::filesystem::path run_dir;
  int64_t steps = 0;
  double final_loss = 0;
  double final_val_loss = -1;
  bool interrupted = false;
  int64_t skipped_steps = 0;              // fp16 steps whose gradients overflowed
  bool preempted = false;                 // stopped by a signal: the job should be requeued
  int64_t resumed_from = 0;               // the step the run continued from (0: started fresh)
  std::filesystem::path last_checkpoint;  // the last checkpoint committed, if any
};

struct TrainOptions {
  // When set, the gradients of the first step (after backward, before clipping) are written here
  // as safetensors, in the names and layout of the weights files (checkpoint/weights.h): for
  // comparing with another implementation. They are dumped as the backward left them, before the
  // overflow check and unscaling: in fp16 each is multiplied by the step's loss scale
  // (metrics.jsonl's loss_scale on logged steps); divide by it before comparing.
  std::filesystem::path first_gradients;
  // The same for later steps: optimizer step (1-based, as metrics.jsonl counts) -> file. A
  // comparison a few steps in also covers the optimizer state and the schedule.
  std::map<int64_t, std::filesystem::path> gradients_at;
  // The ranks to train with (null: this process alone). Only rank 0 writes outputs and prints.
  Communicator* comm = nullptr;
  // "latest", a checkpoint or a directory of them; empty: checkpoint.resume decides.
  std::string resume;
  // Stop after this many steps (of train.steps) with a checkpoint, e.g. to train in slices (0: no).
  int64_t stop_after = 0;
};

// The status a preempted run exits with (EX_TEMPFAIL): the job should be requeued, and will resume.
inline constexpr int kExitRequeue = 75;

TrainSummary train(const recipe::LoadedRecipe& loaded, std::ostream& out, const TrainOptions& options = {});

}  // namespace engine
