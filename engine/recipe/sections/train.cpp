#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_train(Schema& schema) {
  auto train = schema.section("train", &Recipe::train, "The training loop and its batch sizes.");
  train.key("steps", &TrainSection::steps)
      .required()
      .min(1)
      .unit("steps")
      .limit(int64_t(1) << 40)
      .help("Optimizer steps to run.");
  train.key("micro_batch_size", &TrainSection::micro_batch_size)
      .auto_default("derived from the other two batch keys")
      .min(1)
      .unit("samples per rank")
      .limit(1 << 24)
      .help(
          "Samples per forward/backward pass on one rank. global_batch_size = micro_batch_size x "
          "gradient_accumulation_steps x world_size; any two determine the third.");
  train.key("gradient_accumulation_steps", &TrainSection::gradient_accumulation_steps)
      .auto_default("derived from the other two batch keys, or 1")
      .min(1)
      .unit("micro-batches")
      .limit(1 << 20)
      .help("Micro-batches whose gradients are summed before each optimizer step.");
  train.key("global_batch_size", &TrainSection::global_batch_size)
      .auto_default("derived from the other two batch keys")
      .min(1)
      .unit("samples")
      .limit(int64_t(1) << 40)
      .help("Samples per optimizer step across all ranks.");
  train.key("gradient_clipping", &TrainSection::gradient_clipping)
      .def(1.0)
      .min(0)
      .help("Clip gradients to this global L2 norm; 0 disables clipping.");
  train.key("eval_every", &TrainSection::eval_every)
      .def(0)
      .min(0)
      .unit("steps")
      .limit(int64_t(1) << 40)
      .help("Compute the validation loss every this many steps; 0 disables evaluation.");
  train.key("eval_batches", &TrainSection::eval_batches)
      .def(8)
      .min(1)
      .unit("batches")
      .limit(1 << 20)
      .help("Validation batches averaged per evaluation.");
  train.key("log_every", &TrainSection::log_every)
      .def(10)
      .min(1)
      .unit("steps")
      .limit(int64_t(1) << 40)
      .help("Record and print metrics every this many steps.");
}

}  // namespace engine::recipe
