#include "golden/band.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "golden/golden.h"

namespace engine {

double relative_deviation(double want, double got) {
  const double diff = std::abs(got - want);
  return want != 0 ? diff / std::abs(want) : diff;
}

namespace {

// Spread of one metric over the variants, per step.
std::vector<double> spread(const std::vector<StepMetrics>& recorded, const std::vector<VariantRun>& variants,
                           double StepMetrics::*metric, const char* name) {
  std::vector<double> out(recorded.size(), 0.0);
  for (const VariantRun& v : variants) {
    for (size_t i = 0; i < recorded.size(); ++i) {
      const double want = recorded[i].*metric, got = v.steps[i].*metric;
      if (value_class(want) != value_class(got))
        throw UserError(std::string("the run under ") + v.label + " has " + name + " " + std::to_string(got) +
                        " at step " + std::to_string(i + 1) + " where the recording has " + std::to_string(want) +
                        ": this recipe's trajectory depends on the environment beyond rounding; make it less "
                        "sensitive (fewer steps, a lower learning rate) before recording it");
      if (std::isfinite(want)) out[i] = std::max(out[i], relative_deviation(want, got));
    }
  }
  return out;
}

std::vector<double> widen(const std::vector<double>& spread, const BandRule& rule) {
  std::vector<double> band(spread.size());
  double envelope = 0;
  for (size_t i = 0; i < spread.size(); ++i) {
    const size_t last = std::min(spread.size(), i + 1 + size_t(std::max(rule.lookahead, 0)));
    for (size_t j = i; j < last; ++j) envelope = std::max(envelope, spread[j]);
    band[i] = std::max(rule.floor, rule.safety_factor * envelope);
  }
  return band;
}

}  // namespace

Band derive_band(const std::vector<StepMetrics>& recorded, const std::vector<VariantRun>& variants,
                 const BandRule& rule) {
  Band band;
  band.rule = rule;
  for (const VariantRun& v : variants) {
    if (v.steps.size() != recorded.size())
      throw UserError("the run under " + v.label + " trained " + std::to_string(v.steps.size()) +
                      " steps where the recording trained " + std::to_string(recorded.size()) +
                      ": this recipe's trajectory depends on the environment beyond rounding");
    band.variants.push_back(v.label + ": " + v.environment.cpu_isa + ", bf16 matmul " +
                            v.environment.matmul_kernels.at("bf16") + ", " + std::to_string(v.environment.threads) +
                            " threads");
  }
  const auto loss = widen(spread(recorded, variants, &StepMetrics::loss, "loss"), rule);
  const auto grad_norm = widen(spread(recorded, variants, &StepMetrics::grad_norm, "grad_norm"), rule);
  const auto lr = widen(spread(recorded, variants, &StepMetrics::lr, "lr"), rule);
  for (size_t i = 0; i < recorded.size(); ++i) band.steps.push_back({loss[i], grad_norm[i], lr[i]});
  return band;
}

Band with_observed(const Band& band, const std::vector<StepMetrics>& recorded,
                   const std::vector<VariantRun>& observed) {
  const Band extra = derive_band(recorded, observed, band.rule);
  if (band.empty()) return extra;
  Band widened = band;  // the weights' band too: widen_weights_band takes the observed runs' weights
  for (size_t i = 0; i < widened.steps.size(); ++i) {
    StepBand& b = widened.steps[i];
    b.loss = std::max(b.loss, extra.steps[i].loss);
    b.grad_norm = std::max(b.grad_norm, extra.steps[i].grad_norm);
    b.lr = std::max(b.lr, extra.steps[i].lr);
  }
  for (const std::string& label : extra.variants)  // a run observed again is listed once
    if (std::find(widened.variants.begin(), widened.variants.end(), label) == widened.variants.end())
      widened.variants.push_back(label);
  return widened;
}

void widen_weights_band(Band& band, const WeightsFingerprint& recorded, const std::string& recorded_isa,
                        const std::vector<VariantRun>& runs) {
  if (recorded.empty()) return;
  auto measured_on = [&](const std::string& isa) {
    if (std::find(band.weights_isas.begin(), band.weights_isas.end(), isa) == band.weights_isas.end())
      band.weights_isas.push_back(isa);
  };
  measured_on(recorded_isa);
  band.weights.resize(recorded.size(), 0.0);
  for (double& tolerance : band.weights) tolerance = std::max(tolerance, band.rule.floor);
  for (const VariantRun& run : runs) {
    if (run.weights.empty()) continue;
    const std::vector<double> deviations = tensor_deviations(recorded, run.weights);
    for (size_t t = 0; t < deviations.size(); ++t) {
      if (!std::isfinite(deviations[t]))
        throw UserError("the run under " + run.label + " ends with non-finite weights in " + recorded[t].tensor +
                        " where the recording's are finite: this recipe's trajectory depends on the environment "
                        "beyond rounding");
      band.weights[t] = std::max(band.weights[t], band.rule.safety_factor * deviations[t]);
    }
    measured_on(run.environment.cpu_isa);
  }
}

}  // namespace engine
