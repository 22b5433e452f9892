#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_optimizer(Schema& schema) {
  auto optimizer = schema.section("optimizer", &Recipe::optimizer, "How gradients update the weights.");
  optimizer.key("type", &OptimizerSection::type)
      .choices({{"adamw", OptimizerType::adamw}, {"sgd", OptimizerType::sgd}})
      .def(OptimizerType::adamw)
      .help("adamw (decoupled weight decay, bias correction) or sgd (with optional momentum).");
  optimizer.key("lr", &OptimizerSection::lr).def(3e-4).above(0).help("Peak learning rate (the scheduler scales it).");
  optimizer.key("betas", &OptimizerSection::betas)
      .def(std::vector<double>{0.9, 0.999})
      .length(2)
      .min(0)
      .below(1)
      .only_when("type", {"adamw"})
      .help("Decay rates of the first and second moment estimates.");
  optimizer.key("eps", &OptimizerSection::eps)
      .def(1e-8)
      .above(0)
      .only_when("type", {"adamw"})
      .help("Term added to the denominator for numerical stability.");
  optimizer.key("weight_decay", &OptimizerSection::weight_decay)
      .def(0.0)
      .min(0)
      .help("Weight decay coefficient (decoupled for adamw, L2 for sgd).");
  optimizer.key("decay_norms_and_biases", &OptimizerSection::decay_norms_and_biases)
      .def(false)
      .help("Also apply weight decay to biases and normalisation weights (off, as is customary).");
  optimizer.key("momentum", &OptimizerSection::momentum)
      .def(0.0)
      .min(0)
      .below(1)
      .only_when("type", {"sgd"})
      .help("Momentum factor.");
  optimizer.key("nesterov", &OptimizerSection::nesterov)
      .def(false)
      .only_when("type", {"sgd"})
      .help("Use Nesterov momentum (needs momentum > 0).");
}

}  // namespace engine::recipe
