// Rounding noise of the size another machine's kernels make: every fp32 gradient element the
// optimizer reads moved by one fp32 ulp up, one down or not at all, pseudo-randomly per (seed, step,
// element).
//
// A golden's band is measured from reruns under the kernels this machine can force (ISA caps,
// thread counts). Where those all round alike for many steps (bf16 training with exact fp32
// gradients does: the bf16 roundings hide sub-ulp differences), the band stays at its floor, while
// a machine with other kernels (AMX's accumulation order) diverges from the first step. A rerun with
// this noise is one of the band's variants, so the band covers that divergence too;
// tests/golden/golden_power_test.cpp shows noise of another seed passes it.
//
//   TrajectoryProbes probes;
//   probes.after_backward = [](int64_t step, Session& s) { add_one_ulp_gradient_noise(1, step, s); };
#pragma once

#include <cstdint>

namespace engine {

class Session;

// Perturbs the fp32 gradients the optimizer reads, this rank's units, in place: with 16-bit
// gradient storage, their widened fp32 copies.
void add_one_ulp_gradient_noise(uint64_t seed, int64_t step, Session& session);

}  // namespace engine
