#include "golden/gradient_noise.h"

#include <cmath>

#include "core/rng.h"
#include "trainer/session.h"

namespace engine {

void add_one_ulp_gradient_noise(uint64_t seed, int64_t step, Session& session) {
  uint64_t counter = mix64(seed);
  for (size_t u = 0; u < session.model.graph.units().size(); ++u) {
    float* g = session.store.opt_grad(u);
    for (int64_t i = 0; i < session.store.range_size(u); ++i) {
      const uint64_t r = mix64(uint64_t(step) * 0x9e3779b97f4a7c15ull + counter++) % 3;
      // An overflowed element stays infinite (nextafter would make it FLT_MAX, and the fp16 step
      // that should be skipped would be taken).
      if (!std::isfinite(g[i])) continue;
      if (r == 1) g[i] = std::nextafter(g[i], INFINITY);
      if (r == 2) g[i] = std::nextafter(g[i], -INFINITY);
    }
  }
}

}  // namespace engine
