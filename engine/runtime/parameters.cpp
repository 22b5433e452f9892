#include "runtime/parameters.h"

#include <algorithm>

#include "core/convert.h"
#include "core/rng.h"

namespace engine {

ParameterStore::ParameterStore(const Graph& graph) : graph_(graph) {
  if (!graph.params().empty()) {
    param_dtype_ = graph.value(graph.params()[0].value).dtype;
    grad_dtype_ = graph.value(graph.params()[0].grad).dtype;
  }
  for (const Unit& unit : graph.units()) {
    params_.emplace_back(unit.numel * 4);
    grads_.emplace_back(unit.numel * 4);
    if (param_dtype_ != DType::f32) params16_.emplace_back(unit.numel * 2);
    if (grad_dtype_ != DType::f32) grads16_.emplace_back(unit.numel * 2);
  }
}

void* ParameterStore::param_storage(int index) const {
  if (params16_.empty()) return param(index);
  const Param& p = graph_.params()[size_t(index)];
  return params16_[size_t(p.unit)].data() + p.offset * 2;
}

void* ParameterStore::grad_storage(int index) const {
  if (grads16_.empty()) return grad(index);
  const Param& p = graph_.params()[size_t(index)];
  return grads16_[size_t(p.unit)].data() + p.offset * 2;
}

void ParameterStore::refresh_copies() {
  for (size_t u = 0; u < params16_.size(); ++u)
    narrow(params_[u].f32(), params16_[u].data(), param_dtype_, params_[u].bytes() / 4);
}

void ParameterStore::widen_gradients() {
  for (size_t u = 0; u < grads16_.size(); ++u)
    widen(grads16_[u].data(), grad_dtype_, grads_[u].f32(), grads_[u].bytes() / 4);
}

void ParameterStore::retype(DType from, DType to) {
  if (param_dtype_ == from) param_dtype_ = to;
  if (grad_dtype_ == from) grad_dtype_ = to;
  refresh_copies();
}

int64_t ParameterStore::copy_bytes() const {
  int64_t bytes = 0;
  for (const Buffer& b : params16_) bytes += b.bytes();
  for (const Buffer& b : grads16_) bytes += b.bytes();
  return bytes;
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
  refresh_copies();
}

void ParameterStore::zero_grads() {
  for (Buffer& b : grads_) b.zero();
  for (Buffer& b : grads16_) b.zero();
}

}  // namespace engine
