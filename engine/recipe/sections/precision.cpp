#include "recipe/sections/sections.h"

namespace engine::recipe {

namespace {

const std::vector<std::pair<std::string, GradientDType>> kGradientDTypes = {
    {"fp32", GradientDType::fp32}, {"bf16", GradientDType::bf16}, {"fp16", GradientDType::fp16}};

}  // namespace

void declare_precision(Schema& schema) {
  auto precision =
      schema.section("precision", &Recipe::precision,
                     "Numeric precision of the step. In bf16 and fp16 the forward and backward store parameter copies, "
                     "activations and their gradients in 16 bits; master weights and optimizer state stay fp32, and "
                     "softmax, normalisation statistics, the loss and reductions accumulate in fp32. `engine plan` "
                     "prints which op runs in which precision.");
  precision.key("mode", &PrecisionSection::mode)
      .choices({{"fp32", PrecisionMode::fp32}, {"bf16", PrecisionMode::bf16}, {"fp16", PrecisionMode::fp16}})
      .def(PrecisionMode::fp32)
      .help(
          "fp32 everywhere, or 16-bit storage and matmuls (bf16: oneDNN bf16 matmuls where the CPU has "
          "AVX512-BF16; fp16: matmuls computed in fp32 from fp16 operands on CPU) with fp32 master weights.");
  precision.key("accumulation_dtype", &PrecisionSection::accumulation_dtype)
      .choices(kGradientDTypes)
      .def(GradientDType::fp32)
      .help(
          "Type of the parameter gradients that micro-batches accumulate into: fp32, or the 16-bit type of "
          "precision.mode (halves gradient memory, rounds every accumulation).");
  precision.key("communication_dtype", &PrecisionSection::communication_dtype)
      .choices(kGradientDTypes)
      .def(GradientDType::fp32)
      .help(
          "Type gradients are reduced in across ranks. Gradients are reduced in the type they accumulate in "
          "(so every ZeRO stage and world size sums the same bits): across ranks it must equal "
          "accumulation_dtype (validation refuses the recipe otherwise). A single-process run reduces nothing, "
          "so it does not change such a run.");
  precision.key("loss_scaling", &PrecisionSection::loss_scaling)
      .choices({{"dynamic", LossScaling::dynamic}, {"static", LossScaling::fixed}})
      .def(LossScaling::dynamic)
      .only_when("mode", {"fp16"})
      .help(
          "fp16 only. dynamic: the scale backs off on overflow and grows after clean steps; static: one "
          "fixed scale (static_scale). A step whose gradients overflow is skipped either way.");
  precision.key("static_scale", &PrecisionSection::static_scale)
      .def(65536.0)
      .above(0)
      .limit(1e30)
      .only_when("loss_scaling", {"static"})
      .help("The fixed loss scale of loss_scaling: static.");
  precision.key("initial_scale_power", &PrecisionSection::initial_scale_power)
      .def(16)
      .min(0)
      .max(60)
      .only_when("loss_scaling", {"dynamic"})
      .help("The dynamic scale starts at 2^initial_scale_power.");
  precision.key("growth_interval", &PrecisionSection::growth_interval)
      .def(1000)
      .min(1)
      .unit("steps")
      .limit(int64_t(1) << 40)
      .only_when("loss_scaling", {"dynamic"})
      .help("Consecutive steps without overflow after which the scale is multiplied by scale_factor.");
  precision.key("scale_factor", &PrecisionSection::scale_factor)
      .def(2.0)
      .above(1)
      .limit(1e6)
      .only_when("loss_scaling", {"dynamic"})
      .help("The scale grows by this factor and backs off by its inverse.");
  precision.key("hysteresis", &PrecisionSection::hysteresis)
      .def(2)
      .min(1)
      .limit(1 << 20)
      .only_when("loss_scaling", {"dynamic"})
      .help(
          "Overflowing steps tolerated before the scale backs off (the count restarts when the scale "
          "grows); every overflowing step is skipped regardless.");
  precision.key("min_scale", &PrecisionSection::min_scale)
      .def(1.0)
      .above(0)
      .limit(1e30)
      .only_when("loss_scaling", {"dynamic"})
      .help("The scale never backs off below this.");
  precision.key("on_min_scale", &PrecisionSection::on_min_scale)
      .choices({{"abort", MinScaleAction::abort}, {"fallback", MinScaleAction::fallback}})
      .def(MinScaleAction::abort)
      .only_when("loss_scaling", {"dynamic"})
      .help(
          "When a step overflows at min_scale: abort the run (with a message that suggests bf16), or "
          "fall back to bf16 for the rest of the run.");
}

}  // namespace engine::recipe
