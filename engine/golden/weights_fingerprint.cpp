#include "golden/weights_fingerprint.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace engine {

namespace {

// SplitMix64's finaliser: a well-mixed 64-bit word from a counter.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TensorFingerprint fingerprint_tensor(const std::string& tensor, const float* values, int64_t n) {
  TensorFingerprint f{tensor, 0, {}};
  if (n == 0) return f;
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = values[i];
    squares += v * v;
    const uint64_t signs = mix(uint64_t(i));  // one word gives the four directions' signs
    for (size_t k = 0; k < f.sketch.size(); ++k) f.sketch[k] += (signs >> k & 1u) ? v : -v;
  }
  const double scale = 1 / std::sqrt(double(n));
  f.rms = std::sqrt(squares / double(n));
  for (double& s : f.sketch) s *= scale;
  return f;
}

std::vector<double> tensor_deviations(const WeightsFingerprint& recorded, const WeightsFingerprint& got) {
  if (recorded.size() != got.size())
    throw UserError("the final weights have " + std::to_string(got.size()) + " tensors where the recording has " +
                    std::to_string(recorded.size()));
  std::vector<double> out;
  for (size_t t = 0; t < recorded.size(); ++t) {
    const TensorFingerprint &want = recorded[t], &have = got[t];
    if (want.tensor != have.tensor)
      throw UserError("final weights tensor " + std::to_string(t) + " is " + have.tensor + " where the recording has " +
                      want.tensor);
    double change = std::abs(have.rms - want.rms);
    for (size_t k = 0; k < want.sketch.size(); ++k)
      change = std::max(change, std::abs(have.sketch[k] - want.sketch[k]));
    out.push_back(std::isnan(change) ? INFINITY : want.rms > 0 ? change / want.rms : change);
  }
  return out;
}

}  // namespace engine
