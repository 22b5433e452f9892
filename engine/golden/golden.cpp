#include "golden/golden.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/weights.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "data/loader.h"
#include "recipe/export.h"
#include "trainer/plugin_driver.h"
#include "trainer/session.h"

namespace engine {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

uint64_t fnv1a(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

Json tolerance_json(const MetricTolerance& t) { return {{"rtol", t.rtol}, {"atol", t.atol}}; }

MetricTolerance tolerance_of(const Json& j) { return {j.value("rtol", 0.0), j.value("atol", 0.0)}; }

std::string format(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

}  // namespace

std::string TolerancePolicy::describe() const {
  if (exact) return "exact";
  return "loss rtol " + format(loss.rtol) + " atol " + format(loss.atol) + ", grad_norm rtol " +
         format(grad_norm.rtol) + " atol " + format(grad_norm.atol) + ", lr rtol " + format(lr.rtol) + " atol " +
         format(lr.atol);
}

fs::path golden_path(const fs::path& recipe) {
  fs::path path = recipe;
  path.replace_extension(".golden.json");
  return path;
}

std::string recipe_hash(const recipe::LoadedRecipe& loaded) {
  std::string text = recipe::dump_recipe(loaded, recipe::Schema::engine(), false);
  return hex(fnv1a(text.data(), text.size()));
}

Trajectory run_trajectory(const recipe::LoadedRecipe& original) {
  PluginDriver plugins(original, [](const std::string&) {});  // plugins act as in `engine train`, silently
  const recipe::LoadedRecipe& loaded = plugins.recipe();
  const recipe::Recipe& r = loaded.recipe;
  Session session(r);
  session.store.initialize(uint64_t(r.run.seed));
  if (!r.model.init_from.empty()) load_weights(r.model.init_from, session.store, r.model.arch);
  BatchLoader loader(*session.data, session.micro_batch, session.model.sequence, 0);
  Trajectory trajectory;
  plugins.train_start();
  const int64_t rows_per_step = session.micro_batch * session.accumulation * session.model.sequence;
  for (int64_t step = 0; step < r.train.steps; ++step) {
    plugins.step_start(step);
    Session::StepHooks hooks;
    hooks.before_update = plugins.update_hook(step, session);
    auto result = session.train_step(
        step, [&] { return loader.next(); }, hooks);
    trajectory.steps.push_back({step + 1, result.loss, result.grad_norm, result.lr});
    plugins.step_end(step, (step + 1) * rows_per_step, result.overflow, result.loss_scale);
    if (plugins.active() && r.train.eval_every > 0 &&
        ((step + 1) % r.train.eval_every == 0 || step + 1 == r.train.steps))
      plugins.eval(step, session.evaluate(r.train.eval_batches));
    plugins.end_of_step(step, {}, {});
    if (plugins.stop_reason()) break;
  }
  plugins.train_end(int64_t(trajectory.steps.size()), trajectory.steps.empty() ? 0 : trajectory.steps.back().loss, -1,
                    plugins.stop_reason().has_value());
  uint64_t digest = 0xcbf29ce484222325ull;
  for (Buffer& unit : session.store.param_units()) digest = fnv1a(unit.data(), size_t(unit.bytes()), digest);
  trajectory.weights_digest = hex(digest);
  return trajectory;
}

GoldenFile read_golden(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path.string() + ": no golden file; record one with `engine golden record`");
  Json j = Json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("steps"))
    throw UserError(path.string() + ": not a golden file (invalid JSON or no steps)");
  GoldenFile golden;
  try {
    golden.engine_version = j.value("engine_version", "");
    golden.recipe_hash = j.value("recipe_hash", "");
    const Json& policy = j.at("policy");
    golden.policy.exact = policy.value("mode", "exact") == "exact";
    if (!golden.policy.exact) {
      golden.policy.loss = tolerance_of(policy.at("loss"));
      golden.policy.grad_norm = tolerance_of(policy.at("grad_norm"));
      golden.policy.lr = tolerance_of(policy.at("lr"));
    }
    // A non-finite gradient norm (an overflowing fp16 step, skipped) is stored as null.
    auto number = [](const Json& v) { return v.is_null() ? double(INFINITY) : v.get<double>(); };
    for (const Json& s : j.at("steps"))
      golden.trajectory.steps.push_back({s.at("step"), number(s.at("loss")), number(s.at("grad_norm")), s.at("lr")});
    golden.trajectory.weights_digest = j.value("weights_digest", "");
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path.string() + ": malformed golden file: " + e.what());
  }
  return golden;
}

void write_golden(const fs::path& path, const GoldenFile& golden) {
  Json j;
  j["engine_version"] = golden.engine_version;
  j["recipe_hash"] = golden.recipe_hash;
  Json policy = {{"mode", golden.policy.exact ? "exact" : "tolerance"}};
  if (!golden.policy.exact) {
    policy["loss"] = tolerance_json(golden.policy.loss);
    policy["grad_norm"] = tolerance_json(golden.policy.grad_norm);
    policy["lr"] = tolerance_json(golden.policy.lr);
  }
  j["policy"] = policy;
  j["weights_digest"] = golden.trajectory.weights_digest;
  Json steps = Json::array();
  for (const auto& s : golden.trajectory.steps)
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm}, {"lr", s.lr}});
  j["steps"] = steps;
  write_file_atomically(path, [&](std::ostream& out) { out << j.dump(1) << "\n"; });
}

Comparison compare(const GoldenFile& expected, const Trajectory& got) {
  Comparison c;
  const auto& e = expected.trajectory.steps;
  const auto& g = got.steps;
  struct Metric {
    const char* name;
    double StepMetrics::*field;
    MetricTolerance tolerance;
  };
  const Metric metrics[] = {{"loss", &StepMetrics::loss, expected.policy.loss},
                            {"grad_norm", &StepMetrics::grad_norm, expected.policy.grad_norm},
                            {"lr", &StepMetrics::lr, expected.policy.lr}};
  auto within = [&](const Metric& m, double want, double have) {
    if (!std::isfinite(want) || !std::isfinite(have)) return !std::isfinite(want) && !std::isfinite(have);
    if (expected.policy.exact) return std::memcmp(&want, &have, sizeof want) == 0;
    return std::abs(have - want) <= m.tolerance.atol + m.tolerance.rtol * std::abs(want);
  };
  std::ostringstream report, movement;
  if (e.size() != g.size()) {
    c.ok = false;
    report << "  recorded " << e.size() << " steps, the rerun has " << g.size() << "\n";
  }
  // First divergence, and the largest deviation of each metric.
  int64_t first = -1;
  const char* first_metric = "";
  const size_t n = std::min(e.size(), g.size());
  for (const Metric& m : metrics) {
    double worst = 0, worst_rel = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < n; ++i) {
      double want = e[i].*m.field, have = g[i].*m.field;
      if (!within(m, want, have) && (first < 0 || int64_t(i) < first)) {
        first = int64_t(i);
        first_metric = m.name;
      }
      double diff = std::abs(have - want);
      if (diff > worst) {
        worst = diff;
        worst_rel = want != 0 ? diff / std::abs(want) : -1;  // -1: no relative change from zero
        worst_at = i;
      }
    }
    if (worst > 0)
      movement << "  " << m.name << ": largest change " << format(worst)
               << (worst_rel >= 0 ? " (relative " + format(worst_rel) + ")" : std::string(" (from 0)")) << " at step "
               << (n ? e[worst_at].step : 0) << "\n";
  }
  if (first >= 0) {
    c.ok = false;
    report << "  first diverging step: " << e[size_t(first)].step << " (" << first_metric << ")\n";
    report << "    step       loss expected            loss got   grad_norm expected          grad_norm got\n";
    for (size_t i = size_t(std::max<int64_t>(0, first - 2)); i < std::min(n, size_t(first) + 3); ++i) {
      char line[200];
      std::snprintf(line, sizeof line, "  %s %4lld  %18.10g  %18.10g  %18.10g  %18.10g\n",
                    int64_t(i) == first ? ">" : " ", (long long)e[i].step, e[i].loss, g[i].loss, e[i].grad_norm,
                    g[i].grad_norm);
      report << line;
    }
    report << "  largest deviations (policy: " << expected.policy.describe() << "):\n" << movement.str();
  }
  if (expected.policy.exact && c.ok && expected.trajectory.weights_digest != got.weights_digest) {
    c.ok = false;
    report << "  every step matches but the final weights differ (digest " << expected.trajectory.weights_digest
           << " recorded, " << got.weights_digest << " now)\n";
  }
  c.report = report.str();
  c.movement = movement.str().empty() ? "  nothing moved\n" : movement.str();
  return c;
}

}  // namespace engine
