// GELU on tensors large enough for oneDNN's primitive (16K elements or more): both paths, oneDNN's
// and the engine's own loop, forward and backward, in fp32 and bf16, against a double-precision
// GELU of the same stored inputs. The op harness's wide case runs only the path this machine picks
// (nn/gelu_onednn.h); here each path runs wherever it exists.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "core/convert.h"
#include "nn/activation.h"
#include "nn/gelu_onednn.h"
#include "random_values.h"

namespace engine {
namespace {

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_derivative(double x) {
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

class GeluPaths : public ::testing::TestWithParam<std::pair<ops::GeluPath, DType>> {
 protected:
  void TearDown() override { ops::set_gelu_path(ops::GeluPath::automatic); }
};

TEST_P(GeluPaths, LargeTensorsMatchADoubleGeluOfTheStoredInputs) {
  const DType type = GetParam().second;  // a named variable: clang 14 cannot capture structured bindings
  const ops::GeluPath path = GetParam().first;
  const int64_t n = 3 * 16384 + 37;  // past the primitive's threshold, with a ragged tail
  if (path == ops::GeluPath::onednn && !ops::onednn_gelu_available(type, n))
    GTEST_SKIP() << "oneDNN has no JIT GELU for " << dtype_name(type) << " on this CPU";
  ops::set_gelu_path(path);
  Graph g;
  const ValueId x = g.add_activation("x", Shape{n}, type);
  const ValueId y = g.add_activation("y", Shape{n}, type);
  const ValueId dy = g.add_activation("dy", Shape{n}, type);
  const ValueId dx = g.add_activation("dx", Shape{n}, type);
  const Node forward{&ops::kGelu, {x}, {y}, {}, false, false, "gelu"};
  const Node backward{&ops::kGeluBackward, {x, dy}, {dx}, {}, false, true, "gelu"};
  test_util::RandomValues values(g, 3);
  forward.op->cpu(forward, values.ctx);
  backward.op->cpu(backward, values.ctx);
  // fp32: a few ulp of the result (oneDNN's gradient, 0.5 (1 + tanh u) (1 + ...), loses bits of
  // 1 + tanh u where tanh u nears -1: measured up to 9.4e-7); bf16: the result's one rounding
  // (2^-8 relative) and a little.
  const double tolerance = type == DType::f32 ? (path == ops::GeluPath::onednn ? 1e-5 : 2e-6) : 6e-3;
  auto at = [&](ValueId id, int64_t i) { return double(load_float(values.bytes(id).data(), type, i)); };
  double worst_forward = 0, worst_backward = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = at(x, i);
    worst_forward = std::max(worst_forward, std::abs(at(y, i) - gelu(xi)) / (1 + std::abs(gelu(xi))));
    const double want = gelu_derivative(xi) * at(dy, i);
    worst_backward = std::max(worst_backward, std::abs(at(dx, i) - want) / (1 + std::abs(want)));
  }
  EXPECT_LT(worst_forward, tolerance);
  EXPECT_LT(worst_backward, tolerance);
}

INSTANTIATE_TEST_SUITE_P(Paths, GeluPaths,
                         ::testing::Values(std::pair{ops::GeluPath::onednn, DType::f32},
                                           std::pair{ops::GeluPath::engine, DType::f32},
                                           std::pair{ops::GeluPath::onednn, DType::bf16},
                                           std::pair{ops::GeluPath::engine, DType::bf16}),
                         [](const auto& test) {
                           return std::string(test.param.first == ops::GeluPath::onednn ? "onednn_" : "engine_") +
                                  std::string(dtype_name(test.param.second));
                         });

}  // namespace
}  // namespace engine
