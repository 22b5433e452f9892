#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_all_sections(Schema& schema) {
  declare_run(schema);
  declare_model(schema);
  declare_data(schema);
  declare_train(schema);
  declare_optimizer(schema);
  declare_scheduler(schema);
  declare_plugins(schema);
  declare_precision(schema);
  declare_activation_checkpointing(schema);
  declare_distributed(schema);
  declare_checkpoint(schema);
  declare_offload(schema);
  declare_telemetry(schema);
  declare_lora(schema);
}

const Schema& Schema::engine() {
  static const Schema schema = [] {
    Schema s;
    declare_all_sections(s);
    return s;
  }();
  return schema;
}

}  // namespace engine::recipe
