// The final weights of a golden run in a form a tolerance band can hold. The digest (golden.h) is a
// bitwise claim, true only where the recording ran; on other machines the weights are compared by
// their fingerprint: per parameter tensor, its root mean square and four projections onto fixed
// pseudo-random +-1 directions (scaled by 1/sqrt(n)). A perturbation of relative size e in the
// weights moves each projection by about e * rms, so
//
//   deviation = max(|rms' - rms|, max_k |sketch'_k - sketch_k|) / rms
//
// is a tensor's relative change, which the band (Band::weights) bounds tensor by tensor. A dropped last
// update, a wrong last learning rate or a tensor left untrained moves it by orders of magnitude
// more than another machine's rounding does.
//
//   WeightsFingerprint f = {fingerprint_tensor("wte", data, n), ...};
//   std::vector<double> d = tensor_deviations(recorded, f);   // one per tensor
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace engine {

struct TensorFingerprint {
  std::string tensor;
  double rms = 0;
  std::array<double, 4> sketch{};
};
using WeightsFingerprint = std::vector<TensorFingerprint>;

TensorFingerprint fingerprint_tensor(const std::string& tensor, const float* values, int64_t n);

// Each tensor's deviation, as above (infinite where it is NaN). Throws UserError when the two list
// other tensors (another model).
std::vector<double> tensor_deviations(const WeightsFingerprint& recorded, const WeightsFingerprint& got);

}  // namespace engine
