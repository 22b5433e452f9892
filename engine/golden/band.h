// The tolerance band of a golden trajectory: how far, per step and per metric, a correct engine may
// drift from the recording when it runs in another numeric environment (another oneDNN kernel,
// ISA, compiler or thread count). The band is derived from data, not guessed: the recipe is rerun
// under every environment this machine can force (ONEDNN_MAX_CPU_ISA caps, thread counts), and
//
//   spread[s]  = max over variants of |variant[s] - recorded[s]| / |recorded[s]|
//   band[s]    = max(floor, safety_factor * max(spread[1 .. s + lookahead]))
//
// The running maximum keeps the band from shrinking after a divergence has shown itself (chaotic
// growth does not undo itself); the lookahead lets another machine's rounding diverge a few steps
// earlier than any variant did here; the floor (8 fp32 ulps, relative) covers steps where every
// variant happened to agree bitwise.
//
//   Band band = derive_band(recorded, variants, BandRule{});
//   bool ok = band.admits("loss", step_index, recorded_value, value);
#pragma once

#include <string>
#include <vector>

#include "golden/environment.h"
#include "golden/weights_fingerprint.h"

namespace engine {

struct StepMetrics;
struct Trajectory;

struct BandRule {
  double safety_factor = 5;
  int lookahead = 2;                  // steps
  double floor = 9.5367431640625e-7;  // 2^-20: 8 ulps of fp32 (2^-23), relative
};

// A rerun of the recipe under one forced environment.
struct VariantRun {
  std::string label;  // "ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1"
  NumericEnvironment environment;
  std::vector<StepMetrics> steps;
  WeightsFingerprint weights;  // empty: the run did not measure its final weights
};

struct StepBand {
  double loss = 0, grad_norm = 0, lr = 0;  // relative tolerances
};

struct Band {
  BandRule rule;
  std::vector<std::string> variants;  // label: what it ran on (ISA, kernels, threads)
  std::vector<StepBand> steps;        // index = step - 1
  // The final weights' relative tolerance per tensor (weights_fingerprint.h; empty when no run
  // measured them), and the CPU ISAs it was measured on: elsewhere the weights cannot be judged and
  // are not checked. Per tensor, because tensors differ: a gradient that is zero in exact arithmetic
  // (the key projection's bias) leaves its tensor to rounding noise, which Adam turns into steps.
  std::vector<double> weights;
  std::vector<std::string> weights_isas;
  bool empty() const { return steps.empty(); }
};

// Throws UserError when a variant's run is not comparable (another step count, or a non-finite
// value where the recording has a finite one): such a recipe cannot have a portable golden.
Band derive_band(const std::vector<StepMetrics>& recorded, const std::vector<VariantRun>& variants,
                 const BandRule& rule);

// `band` widened to cover `observed` runs too: trajectories run on other machines, under kernels no
// cap here can force (AMX, another oneDNN build; `engine golden observe`). Per step and metric the
// larger of the two, so a band never narrows; the observed runs' labels join the variants'. The
// result is derive_band over the variants and the observed runs together (a maximum of maxima).
Band with_observed(const Band& band, const std::vector<StepMetrics>& recorded, const std::vector<VariantRun>& observed);

// Widens band.weights, per tensor, to safety_factor times the largest deviation of the runs that
// measured their final weights (at least the floor; never narrower than before), and records their
// ISAs and the recording's. Runs without weights (observed by an older engine) leave it as it is.
void widen_weights_band(Band& band, const WeightsFingerprint& recorded, const std::string& recorded_isa,
                        const std::vector<VariantRun>& runs);

// The relative deviation used throughout: |got - want| / |want| (|got - want| when want is 0).
double relative_deviation(double want, double got);

}  // namespace engine
