#include "golden/golden_json.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "recipe/load.h"

namespace engine {

using OrderedJson = nlohmann::ordered_json;

namespace {

OrderedJson value_json(double v) {
  switch (value_class(v)) {
    case ValueClass::nan:
      return "nan";
    case ValueClass::positive_infinity:
      return "inf";
    case ValueClass::negative_infinity:
      return "-inf";
    case ValueClass::finite:
      break;
  }
  return v;
}

double value_of(const OrderedJson& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string text = j.get<std::string>();
    if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw UserError("a step value is " + j.dump() + ": expected a number, \"nan\", \"inf\" or \"-inf\"");
}

// Steps without their bands: an observed run's.
OrderedJson steps_json(const std::vector<StepMetrics>& steps) {
  OrderedJson out = OrderedJson::array();
  for (const StepMetrics& s : steps)
    out.push_back({{"step", s.step},
                   {"loss", value_json(s.loss)},
                   {"grad_norm", value_json(s.grad_norm)},
                   {"lr", value_json(s.lr)}});
  return out;
}

std::vector<StepMetrics> steps_from_json(const OrderedJson& j) {
  std::vector<StepMetrics> out;
  for (const OrderedJson& step : j)
    out.push_back(
        {step.at("step"), value_of(step.at("loss")), value_of(step.at("grad_norm")), value_of(step.at("lr"))});
  return out;
}

// The final weights' fingerprint: absent (an empty list) in files written before it existed.
// With the band's per-tensor tolerance beside each tensor where there is one.
OrderedJson weights_json(const WeightsFingerprint& weights, const std::vector<double>& rtol = {}) {
  OrderedJson out = OrderedJson::array();
  for (const TensorFingerprint& t : weights)
    out.push_back({{"tensor", t.tensor}, {"rms", value_json(t.rms)}, {"sketch", OrderedJson::array()}});
  for (size_t i = 0; i < weights.size(); ++i) {
    for (double v : weights[i].sketch) out[i]["sketch"].push_back(value_json(v));
    if (i < rtol.size()) out[i]["rtol"] = rtol[i];
  }
  return out;
}

WeightsFingerprint weights_from_json(const OrderedJson& j, const char* key) {
  WeightsFingerprint out;
  if (!j.contains(key)) return out;
  for (const OrderedJson& t : j.at(key)) {
    TensorFingerprint f{t.at("tensor"), value_of(t.at("rms")), {}};
    const OrderedJson& sketch = t.at("sketch");
    if (!sketch.is_array() || sketch.size() != f.sketch.size())
      throw UserError("final weights of " + f.tensor + ": sketch is " + sketch.dump() + ", expected " +
                      std::to_string(f.sketch.size()) + " numbers");
    for (size_t k = 0; k < f.sketch.size(); ++k) f.sketch[k] = value_of(sketch[k]);
    out.push_back(f);
  }
  return out;
}

}  // namespace

OrderedJson environment_to_json(const NumericEnvironment& env) {
  OrderedJson kernels = OrderedJson::object();
  for (const auto& [path, kernel] : env.matmul_kernels) kernels[path] = kernel;
  return {{"compiler", env.compiler},  {"compiler_flags", env.compiler_flags},
          {"onednn", env.onednn},      {"cpu_isa", env.cpu_isa},
          {"matmul_kernels", kernels}, {"threads", env.threads}};
}

NumericEnvironment environment_from_json(const OrderedJson& j) {
  NumericEnvironment env;
  env.compiler = j.at("compiler");
  env.compiler_flags = j.at("compiler_flags");
  env.onednn = j.at("onednn");
  env.cpu_isa = j.at("cpu_isa");
  for (const auto& [path, kernel] : j.at("matmul_kernels").items()) env.matmul_kernels[path] = kernel;
  env.threads = j.at("threads");
  return env;
}

OrderedJson golden_to_json(const GoldenFile& golden) {
  OrderedJson j;
  j["format"] = kGoldenFormat;
  j["engine_version"] = golden.engine_version;
  j["engine_commit"] = golden.engine_commit;
  j["recipe_hash"] = golden.recipe_hash;
  if (golden.world_size != 1) j["world_size"] = golden.world_size;  // absent: 1, as before ranks existed
  j["environment"] = environment_to_json(golden.environment);
  const BandRule& rule = golden.band.rule;
  j["band"] = {{"rule",
                "band[s] = max(floor, safety_factor * max(spread[1 .. s + lookahead])); spread[s] = max over the "
                "variants of |variant[s] - recorded[s]| / |recorded[s]|"},
               {"safety_factor", rule.safety_factor},
               {"lookahead", rule.lookahead},
               {"floor", rule.floor},
               {"variants", golden.band.variants}};
  if (!golden.band.weights.empty()) j["band"]["final_weights_measured_on"] = golden.band.weights_isas;
  j["weights_digest"] = golden.trajectory.weights_digest;
  if (!golden.trajectory.weights.empty())
    j["final_weights"] = weights_json(golden.trajectory.weights, golden.band.weights);
  if (!golden.observed.empty()) {
    OrderedJson observed = OrderedJson::array();
    for (const VariantRun& run : golden.observed) {
      OrderedJson entry = {{"label", run.label},
                           {"environment", environment_to_json(run.environment)},
                           {"steps", steps_json(run.steps)}};
      if (!run.weights.empty()) entry["final_weights"] = weights_json(run.weights);
      observed.push_back(entry);
    }
    j["observed"] = observed;
  }
  OrderedJson steps = OrderedJson::array();
  const auto& s = golden.trajectory.steps;
  for (size_t i = 0; i < s.size(); ++i) {
    OrderedJson step = {{"step", s[i].step},
                        {"loss", value_json(s[i].loss)},
                        {"grad_norm", value_json(s[i].grad_norm)},
                        {"lr", value_json(s[i].lr)}};
    if (i < golden.band.steps.size()) {
      const StepBand& b = golden.band.steps[i];
      step["rtol"] = {{"loss", b.loss}, {"grad_norm", b.grad_norm}, {"lr", b.lr}};
    }
    steps.push_back(step);
  }
  j["steps"] = steps;
  return j;
}

GoldenFile golden_from_json(const OrderedJson& j) {
  GoldenFile golden;
  golden.engine_version = j.at("engine_version");
  golden.engine_commit = j.at("engine_commit");
  golden.recipe_hash = j.at("recipe_hash");
  if (j.contains("world_size")) {
    const OrderedJson& world = j.at("world_size");
    if (!world.is_number_integer() || world.get<int64_t>() < 1 || world.get<int64_t>() > recipe::kMaxWorldSize)
      throw UserError("world_size is " + world.dump() + ": expected a whole number from 1 to " +
                      std::to_string(recipe::kMaxWorldSize));
    golden.world_size = world.get<int>();
  }
  golden.environment = environment_from_json(j.at("environment"));
  const OrderedJson& band = j.at("band");
  golden.band.rule = {
      .safety_factor = band.at("safety_factor"), .lookahead = band.at("lookahead"), .floor = band.at("floor")};
  golden.band.variants = band.at("variants").get<std::vector<std::string>>();
  golden.trajectory.weights_digest = j.at("weights_digest");
  golden.trajectory.weights = weights_from_json(j, "final_weights");
  if (band.contains("final_weights_measured_on")) {
    golden.band.weights_isas = band.at("final_weights_measured_on").get<std::vector<std::string>>();
    for (const OrderedJson& t : j.at("final_weights")) golden.band.weights.push_back(t.at("rtol"));
  }
  if (j.contains("observed"))
    for (const OrderedJson& run : j.at("observed"))
      golden.observed.push_back({.label = run.at("label"),
                                 .environment = environment_from_json(run.at("environment")),
                                 .steps = steps_from_json(run.at("steps")),
                                 .weights = weights_from_json(run, "final_weights")});
  bool banded = true;
  for (const OrderedJson& step : j.at("steps")) {
    golden.trajectory.steps.push_back(
        {step.at("step"), value_of(step.at("loss")), value_of(step.at("grad_norm")), value_of(step.at("lr"))});
    banded = banded && step.contains("rtol");
    if (banded) {
      const OrderedJson& r = step.at("rtol");
      golden.band.steps.push_back({r.at("loss"), r.at("grad_norm"), r.at("lr")});
    }
  }
  if (!banded) golden.band.steps.clear();  // all steps or none
  return golden;
}

}  // namespace engine
