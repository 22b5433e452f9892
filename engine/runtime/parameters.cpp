#include "runtime/parameters.h"

#include <algorithm>

#include "core/rng.h"

namespace engine {

ParameterStore::ParameterStore(const Graph& graph) : graph_(graph) {
  for (const Unit& unit : graph.units()) {
    params_.emplace_back(unit.numel * 4);
    grads_.emplace_back(unit.numel * 4);
  }
}

float* ParameterStore::param(int index) const {
  const Param& p = graph_.params()[size_t(index)];
  return params_[size_t(p.unit)].f32() + p.offset;
}

float* ParameterStore::grad(int index) const {
  const Param& p = graph_.params()[size_t(index)];
  return grads_[size_t(p.unit)].f32() + p.offset;
}

void ParameterStore::initialize(uint64_t seed) {
  RandomStream stream(seed, RandomPurpose::init);
  for (size_t i = 0; i < graph_.params().size(); ++i) {
    const Param& p = graph_.params()[i];
    float* data = param(int(i));
    int64_t n = numel(int(i));
    switch (p.init.kind) {
      case ParamInit::Kind::zeros:
        std::fill_n(data, n, 0.0f);
        break;
      case ParamInit::Kind::ones:
        std::fill_n(data, n, 1.0f);
        break;
      case ParamInit::Kind::normal:
        for (int64_t k = 0; k < n; ++k) data[k] = float(p.init.std) * stream.normal();
        break;
    }
  }
}

void ParameterStore::zero_grads() {
  for (Buffer& b : grads_) b.zero();
}

}  // namespace engine
