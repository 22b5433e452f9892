// The instruction-set paths of the optimizer update kernels (update_kernels.h), run by name: the
// tests check that every path gives the same bits, and the benchmark times each one. Every path is
// multi-threaded the same way; adamw_update and sgd_update run best_isa().
#pragma once

#include <cstdint>

#include "optim/update_kernels.h"

namespace engine::update_isa {

enum class Isa { scalar, avx2, avx512 };

const char* name(Isa isa);
bool supported(Isa isa);  // whether this build and this CPU run it
Isa best();               // the widest supported path

// The update on path `isa` (which must be supported).
void adamw(Isa isa, float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);
void sgd(Isa isa, float* w, const float* g, float* momentum_buffer, int64_t n, const SgdScalars& s);

}  // namespace engine::update_isa
