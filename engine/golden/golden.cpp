#include "golden/golden.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "checkpoint/weights.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "golden/golden_json.h"
#include "golden/weights_fingerprint.h"
#include "recipe/export.h"
#include "trainer/plugin_driver.h"
#include "trainer/session.h"

namespace engine {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

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

std::string format(double v, int digits = 9) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*g", digits, v);
  return text;
}

}  // namespace

ValueClass value_class(double value) {
  if (std::isnan(value)) return ValueClass::nan;
  if (std::isinf(value)) return value > 0 ? ValueClass::positive_infinity : ValueClass::negative_infinity;
  return ValueClass::finite;
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

namespace {

// The digest of the whole fp32 parameters, in unit and offset order, and their fingerprint. A
// unit's parameters tile its [0, numel) (the padding a sharded layout adds follows them), so this
// hashes the bytes that hashing each unit's masters from 0 to numel did before ranks existed. A
// collective when sharded.
void record_final_weights(Session& session, Trajectory& trajectory) {
  session.sync_host();
  const WholeParameters whole(session.store, session.comm);
  const Graph& graph = session.model.graph;
  std::vector<int> order(graph.params().size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int i) { return std::pair(graph.params()[size_t(i)].unit, graph.params()[size_t(i)].offset); };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
  std::vector<int64_t> covered(graph.units().size(), 0);
  uint64_t digest = 0xcbf29ce484222325ull;
  for (int i : order) {
    const Param& p = graph.params()[size_t(i)];
    ENGINE_CHECK(p.offset == covered[size_t(p.unit)],
                 "parameter " + p.name + " does not follow its unit's previous one");
    covered[size_t(p.unit)] += session.store.numel(i);
    digest = fnv1a(whole.param(i), size_t(session.store.numel(i)) * 4, digest);
    trajectory.weights.push_back(fingerprint_tensor(p.name, whole.param(i), session.store.numel(i)));
  }
  for (size_t u = 0; u < graph.units().size(); ++u)
    ENGINE_CHECK(covered[u] == graph.units()[u].numel,
                 "unit " + graph.units()[u].name + "'s parameters do not tile it");
  trajectory.weights_digest = hex(digest);
}

}  // namespace

Trajectory run_trajectory(const recipe::LoadedRecipe& original, const TrajectoryProbes& probes, Communicator* comm) {
  PluginDriver plugins(original, [](const std::string&) {});  // plugins act as in `engine train`, silently
  const recipe::LoadedRecipe& loaded = plugins.recipe();
  const recipe::Recipe& r = loaded.recipe;
  if (r.distributed.tensor_parallel > 1 || r.distributed.pipeline_parallel > 1)
    throw UserError(
        "goldens record data-parallel runs; set distributed.tensor_parallel and pipeline_parallel to 1 (a split run "
        "trains the same model: a pipeline to its bits, tensor parallelism within the tolerance docs/parallelism.md "
        "derives)");
  Session session(r, compile_step(r, comm ? comm->size() : 1), comm);
  session.initialize(uint64_t(r.run.seed));
  if (!r.model.init_from.empty()) load_weights(r.model.init_from, session.store, r.model.arch);
  Trajectory trajectory;
  plugins.train_start();
  const int64_t rows_per_step = session.micro_batch * session.accumulation * session.model.sequence * session.world;
  for (int64_t step = 0; step < r.train.steps; ++step) {
    plugins.step_start(step);
    Session::StepHooks hooks;
    hooks.before_update = plugins.update_hook(step, session);
    if (probes.after_backward) hooks.after_backward = [&] { probes.after_backward(step, session); };
    if (probes.before_update)
      hooks.before_update = [&, plugin_hook = hooks.before_update](Session::StepResult& result) {
        probes.before_update(step, result.lr);
        return plugin_hook ? plugin_hook(result) : true;
      };
    // A batch is a pure function of its index (data/dataset.h), so the order can be remapped here.
    // Rank r trains global micro-batches r, r + world, ... of the step, as BatchLoader gives them.
    const int64_t batch_step = probes.batch_of_step ? probes.batch_of_step(step) : step;
    int64_t micro = 0;
    auto next_batch = [&] {
      Batch batch(session.micro_batch, session.model.sequence, session.data->features());
      const int64_t global_micro = batch_step * session.accumulation + micro++;
      session.data->fill(Split::train, global_micro * session.world + session.rank, batch);
      return batch;
    };
    auto result = session.train_step(step, next_batch, hooks);
    trajectory.steps.push_back({step + 1, result.loss, result.grad_norm, result.lr});
    plugins.step_end(step, (step + 1) * rows_per_step, result.overflow, result.loss_scale);
    if (plugins.active() && r.train.eval_every > 0 &&
        ((step + 1) % r.train.eval_every == 0 || step + 1 == r.train.steps))
      plugins.eval(step, session.evaluate(r.train.eval_batches));
    plugins.end_of_step(step);
    plugins.take_checkpoint_request();  // golden runs write no files
    if (plugins.stop_reason()) break;
  }
  plugins.train_end(int64_t(trajectory.steps.size()), trajectory.steps.empty() ? 0 : trajectory.steps.back().loss, -1,
                    plugins.stop_reason().has_value());
  record_final_weights(session, trajectory);
  return trajectory;
}

GoldenFile read_golden(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path.string() + ": no golden file; record one with `engine golden record`");
  OrderedJson j = OrderedJson::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("steps"))
    throw UserError(path.string() + ": not a golden file (invalid JSON or no steps)");
  if (j.value("format", 1) != kGoldenFormat)
    throw UserError(path.string() + ": golden file format " + std::to_string(j.value("format", 1)) +
                    ", this engine reads format " + std::to_string(kGoldenFormat) +
                    "; record it again with `engine golden update`");
  try {
    return golden_from_json(j);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path.string() + ": malformed golden file: " + e.what());
  } catch (const UserError& e) {
    throw UserError(path.string() + ": " + e.what());
  }
}

void write_golden(const fs::path& path, const GoldenFile& golden) {
  const OrderedJson j = golden_to_json(golden);
  write_file_atomically(path, [&](std::ostream& out) { out << j.dump(1) << "\n"; });
}

namespace {

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

struct Metric {
  const char* name;
  double StepMetrics::*value;
  double StepBand::*rtol;
};
constexpr Metric kMetrics[] = {{"loss", &StepMetrics::loss, &StepBand::loss},
                               {"grad_norm", &StepMetrics::grad_norm, &StepBand::grad_norm},
                               {"lr", &StepMetrics::lr, &StepBand::lr}};

// The widest band of each metric, for the one-line description of a banded check.
std::string widest_band(const Band& band) {
  std::vector<std::string> parts;
  for (const Metric& m : kMetrics) {
    double widest = 0;
    for (const StepBand& b : band.steps) widest = std::max(widest, b.*m.rtol);
    parts.push_back(std::string(m.name) + " rtol up to " + format(widest, 3));
  }
  if (!band.weights.empty())
    parts.push_back("final weights rtol up to " +
                    format(*std::max_element(band.weights.begin(), band.weights.end()), 3));
  return join(parts, ", ");
}

}  // namespace

namespace {

// One pass over the steps: the first divergence, the largest deviation of each metric, and how
// much of the band the run used.
struct Scan {
  int64_t first = -1;  // index of the first step outside the check, -1: none
  const char* first_metric = "";
  double band_used = 0;
  std::string movement;
};

Scan scan(const GoldenFile& expected, const Trajectory& got, bool bitwise) {
  const auto& e = expected.trajectory.steps;
  const auto& g = got.steps;
  auto within = [&](const Metric& m, size_t i, double want, double have) {
    if (value_class(want) != value_class(have)) return false;
    if (!std::isfinite(want)) return true;  // same non-finite class
    if (bitwise) return std::memcmp(&want, &have, sizeof want) == 0;
    return relative_deviation(want, have) <= expected.band.steps[i].*m.rtol;
  };
  Scan out;
  std::ostringstream movement;
  const size_t n = std::min(e.size(), g.size());
  for (const Metric& m : kMetrics) {
    double worst = 0, worst_rel = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = e[i].*m.value, have = g[i].*m.value;
      if (!within(m, i, want, have) && (out.first < 0 || int64_t(i) < out.first)) {
        out.first = int64_t(i);
        out.first_metric = m.name;
      }
      double diff = std::abs(have - want);
      if (!bitwise && std::isfinite(want) && std::isfinite(have))
        out.band_used = std::max(out.band_used, relative_deviation(want, have) / expected.band.steps[i].*m.rtol);
      if (value_class(want) != value_class(have)) diff = INFINITY;
      if (!std::isfinite(want) && value_class(want) == value_class(have)) diff = 0;
      if (diff > worst) {
        worst = diff;
        worst_rel = want != 0 ? diff / std::abs(want) : -1;  // -1: no relative change from zero
        worst_at = i;
      }
    }
    if (worst == 0) continue;
    movement << "  " << m.name << ": largest change " << format(worst)
             << (worst_rel >= 0 ? " (relative " + format(worst_rel) + ")" : std::string(" (from 0)")) << " at step "
             << e[worst_at].step;
    if (!bitwise) movement << ", band there " << format(expected.band.steps[worst_at].*m.rtol, 3);
    movement << "\n";
  }
  out.movement = movement.str();
  return out;
}

// The steps around the first divergence, recorded beside rerun.
std::string divergence_table(const std::vector<StepMetrics>& e, const std::vector<StepMetrics>& g, size_t first) {
  std::string table = "    step       loss expected            loss got   grad_norm expected          grad_norm got\n";
  const size_t n = std::min(e.size(), g.size());
  for (size_t i = first < 2 ? 0 : first - 2; i < std::min(n, first + 3); ++i) {
    char line[200];
    std::snprintf(line, sizeof line, "  %s %4lld  %18.10g  %18.10g  %18.10g  %18.10g\n", i == first ? ">" : " ",
                  (long long)e[i].step, e[i].loss, g[i].loss, e[i].grad_norm, g[i].grad_norm);
    table += line;
  }
  return table;
}

// Off the recording's environment, the final weights by their fingerprint against the band's
// weights tolerance, where a run on this ISA measured it; otherwise the mode says why not.
void check_weights_in_band(const GoldenFile& expected, const Trajectory& got, const NumericEnvironment& here,
                           Comparison& c, std::string& report) {
  const Band& band = expected.band;
  if (band.weights.empty() || band.weights.size() != expected.trajectory.weights.size()) {
    c.mode += "; final weights not checked: the golden file has no weights band (engine golden update)";
    return;
  }
  if (std::find(band.weights_isas.begin(), band.weights_isas.end(), here.cpu_isa) == band.weights_isas.end()) {
    c.mode += "; final weights not checked: no run on " + here.cpu_isa +
              " measured them (engine golden trajectory there, engine golden observe here)";
    return;
  }
  const std::vector<double> deviations = tensor_deviations(expected.trajectory.weights, got.weights);
  for (size_t t = 0; t < deviations.size(); ++t) {
    c.band_used = std::max(c.band_used, deviations[t] / band.weights[t]);
    if (!(deviations[t] <= band.weights[t])) {
      c.ok = false;
      report += "  final weights: " + expected.trajectory.weights[t].tensor + " changed by " + format(deviations[t]) +
                " relative, band " + format(band.weights[t], 3) + "\n";
    }
  }
}

}  // namespace

Comparison compare(const GoldenFile& expected, const Trajectory& got, const NumericEnvironment& here) {
  Comparison c;
  const auto& e = expected.trajectory.steps;
  const std::vector<std::string> differences = expected.environment.differences(here);
  c.bitwise = differences.empty();
  if (c.bitwise) {
    c.mode = "environment matches the recording; checked bitwise";
  } else {
    c.mode = "environment differs: " + join(differences, "; ");
    if (expected.band.steps.size() != e.size()) {
      c.ok = false;
      c.mode += "; the golden file has no tolerance band, so it can only be checked where it was recorded";
      c.report = "  record it again with `engine golden update` to derive a band\n";
      return c;
    }
    c.mode += "; checked within the golden's band (" + widest_band(expected.band) + ")";
  }
  std::string report;
  if (e.size() != got.steps.size()) {
    c.ok = false;
    report +=
        "  recorded " + std::to_string(e.size()) + " steps, the rerun has " + std::to_string(got.steps.size()) + "\n";
  }
  const Scan s = scan(expected, got, c.bitwise);
  if (s.first >= 0) {
    c.ok = false;
    report += "  first diverging step: " + std::to_string(e[size_t(s.first)].step) + " (" + s.first_metric + ")\n";
    report += divergence_table(e, got.steps, size_t(s.first));
    report += "  largest deviations:\n" + s.movement;
  }
  if (c.bitwise && c.ok && expected.trajectory.weights_digest != got.weights_digest) {
    c.ok = false;
    report += "  every step matches but the final weights differ (digest " + expected.trajectory.weights_digest +
              " recorded, " + got.weights_digest + " now)\n";
  }
  c.band_used = s.band_used;
  if (!c.bitwise) check_weights_in_band(expected, got, here, c, report);
  if (!c.bitwise) c.mode += "; largest deviation " + format(100 * c.band_used, 2) + "% of the band";
  c.report = report;
  c.movement = s.movement.empty() ? "  nothing moved\n" : s.movement;
  return c;
}

}  // namespace engine
