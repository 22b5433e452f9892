#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_scheduler(Schema& schema) {
  auto scheduler = schema.section("scheduler", &Recipe::scheduler, "How the learning rate changes over the run.");
  scheduler.key("type", &SchedulerSection::type)
      .choices(
          {{"constant", SchedulerType::constant}, {"linear", SchedulerType::linear}, {"cosine", SchedulerType::cosine}})
      .def(SchedulerType::constant)
      .help(
          "After warmup: constant keeps optimizer.lr; linear and cosine decay it over the remaining steps "
          "toward min_lr, reached just after the last step (step s of n after warmup runs at progress s/n).");
  scheduler.key("warmup_steps", &SchedulerSection::warmup_steps)
      .def(0)
      .min(0)
      .unit("steps")
      .limit(int64_t(1) << 40)
      .help(
          "Steps of linear warmup to optimizer.lr: step s (counted from 0) of the first warmup_steps runs at "
          "optimizer.lr x (s + 1) / warmup_steps. More than train.steps (a run shortened from the command "
          "line) is clamped to train.steps, so the whole run warms up and reaches optimizer.lr at its last "
          "step.");
  scheduler.key("min_lr", &SchedulerSection::min_lr)
      .def(0.0)
      .min(0)
      .only_when("type", {"linear", "cosine"})
      .help("Learning rate reached at the end of the decay; at most optimizer.lr.");
}

}  // namespace engine::recipe
