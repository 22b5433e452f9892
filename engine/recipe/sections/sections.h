// The recipe's sections, each declared in its own file. A feature that adds a section writes
// declare_<section>() and calls it from declare_all_sections().
#pragma once

#include "recipe/schema.h"

namespace engine::recipe {

void declare_run(Schema& schema);
void declare_model(Schema& schema);
void declare_data(Schema& schema);
void declare_train(Schema& schema);
void declare_optimizer(Schema& schema);
void declare_scheduler(Schema& schema);
void declare_plugins(Schema& schema);
void declare_precision(Schema& schema);
void declare_activation_checkpointing(Schema& schema);
void declare_distributed(Schema& schema);
void declare_checkpoint(Schema& schema);
void declare_offload(Schema& schema);
void declare_telemetry(Schema& schema);
void declare_lora(Schema& schema);

void declare_all_sections(Schema& schema);

}  // namespace engine::recipe
