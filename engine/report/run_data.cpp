#include "report/run_data.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "core/whole_file.h"

namespace engine::report {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const Series* RunData::find(const std::string& key) const {
  auto it = metrics.find(key);
  return it == metrics.end() || it->second.empty() ? nullptr : &it->second;
}

std::optional<double> RunData::summary_number(const std::string& key) const {
  auto it = summary.find(key);
  if (it == summary.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

namespace {

std::string read_text(const fs::path& path) {
  std::optional<std::string> text = read_whole_file(path);
  if (!text) throw UserError("cannot read " + path.string());
  return std::move(*text);
}

void read_metrics(const fs::path& path, RunData& run) {
  std::ifstream in(path);
  if (!in) throw UserError("cannot read " + path.string());
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path.string() + ":" + std::to_string(number);
    Json entry;
    try {
      entry = Json::parse(line);
    } catch (const Json::parse_error& e) {
      // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 7: ...".
      std::string what = e.what();
      if (auto column = what.find("column "); column != std::string::npos) what = what.substr(column);
      throw UserError(where + ": not a JSON line (" + what + ")");
    }
    if (!entry.is_object()) throw UserError(where + ": expected a JSON object, found " + line.substr(0, 40));
    auto step = entry.find("step");
    if (step == entry.end() || !step->is_number()) throw UserError(where + ": no numeric \"step\"");
    const double x = step->get<double>();
    if (auto event = entry.find("event"); event != entry.end()) {
      if (*event == "checkpoint") run.checkpoint_steps.push_back(x);
      continue;  // resume, set_lr, skip_step, ...: not series
    }
    if (entry.value("overflow", false)) {
      run.overflow_steps.push_back(x);
      continue;  // its loss is that of a skipped update
    }
    if (auto val = entry.find("val_loss"); val != entry.end() && !entry.contains("loss")) {
      if (val->is_number()) {
        run.val_loss.steps.push_back(x);
        run.val_loss.values.push_back(val->get<double>());
      }
      continue;
    }
    for (const auto& [key, value] : entry.items()) {
      if (key == "step" || !value.is_number()) continue;
      Series& series = key == "val_loss" ? run.val_loss : run.metrics[key];
      series.steps.push_back(x);
      series.values.push_back(value.get<double>());
    }
  }
}

std::string strip_trailing_slash(std::string text) {
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

}  // namespace

std::optional<Breakdown> compute_breakdown(const Json& trace, const std::string& source) {
  const Json* events = &trace;
  if (trace.is_object()) {
    auto it = trace.find("traceEvents");
    if (it == trace.end()) throw UserError(source + ": no \"traceEvents\" array");
    events = &*it;
  }
  if (!events->is_array()) throw UserError(source + ": \"traceEvents\" is not an array");

  struct Span {
    double ts, dur;
    int64_t tid;
    std::string name, cat;
  };
  std::vector<Span> steps, inner;
  for (const Json& e : *events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;  // metadata, instants, counters
    if (!e.contains("pid") || !e["pid"].is_number() || e["pid"].get<int64_t>() != 0) continue;
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number()) continue;
    Span span{e["ts"].get<double>(), e["dur"].get<double>(),
              e.contains("tid") && e["tid"].is_number() ? e["tid"].get<int64_t>() : 0, e.value("name", ""),
              e.value("cat", "other")};
    (span.cat == "step" ? steps : inner).push_back(std::move(span));
  }
  if (steps.empty()) return std::nullopt;

  double total_us = 0;
  for (const Span& s : steps) total_us += s.dur;
  auto inside_a_step = [&](const Span& e) {
    return std::any_of(steps.begin(), steps.end(), [&](const Span& s) { return e.ts >= s.ts && e.ts < s.ts + s.dur; });
  };
  // An event nested in another on the same thread (an op inside a checkpoint's write) is counted
  // once, in the outer one's category; ops are counted by name wherever they are.
  std::sort(inner.begin(), inner.end(), [](const Span& a, const Span& b) {
    return a.tid != b.tid ? a.tid < b.tid : a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
  });
  std::map<std::string, double> by_cat, by_op;
  int64_t tid = -1;
  double outer_end = -1;
  for (const Span& e : inner) {
    if (!inside_a_step(e)) continue;
    if (e.cat == "op") by_op[e.name] += e.dur;
    if (e.tid == tid && e.ts < outer_end) continue;
    tid = e.tid;
    outer_end = e.ts + e.dur;
    by_cat[e.cat] += e.dur;
  }
  double attributed = 0;
  for (const auto& [cat, us] : by_cat) attributed += us;
  if (total_us - attributed > 1e-9 * total_us) by_cat["untraced"] = total_us - attributed;

  Breakdown out;
  out.steps = int64_t(steps.size());
  out.step_ms = total_us / 1000.0 / double(steps.size());
  auto rows = [&](const std::map<std::string, double>& sums) {
    std::vector<BreakdownRow> list;
    for (const auto& [name, us] : sums)
      list.push_back({name, us / 1000.0 / double(steps.size()), total_us > 0 ? 100.0 * us / total_us : 0});
    std::stable_sort(list.begin(), list.end(),
                     [](const BreakdownRow& a, const BreakdownRow& b) { return a.ms_per_step > b.ms_per_step; });
    return list;
  };
  out.categories = rows(by_cat);
  out.ops = rows(by_op);
  if (out.ops.size() > Breakdown::kMaxOps) {
    BreakdownRow rest{"other ops", 0, 0};
    for (size_t i = Breakdown::kMaxOps; i < out.ops.size(); ++i) {
      rest.ms_per_step += out.ops[i].ms_per_step;
      rest.percent += out.ops[i].percent;
    }
    out.ops.resize(Breakdown::kMaxOps);
    out.ops.push_back(rest);
  }
  return out;
}

RunData read_run(const fs::path& dir, const std::string& label) {
  RunData run;
  run.dir = dir;
  run.label = label.empty() ? strip_trailing_slash(dir.string()) : label;
  if (!fs::is_directory(dir)) throw UserError("run directory not found: " + dir.string());
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics))
    throw UserError("no metrics.jsonl in " + dir.string() + " (is it a run directory of `engine train`?)");
  read_metrics(metrics, run);

  if (const fs::path path = dir / "summary.json"; fs::is_regular_file(path)) {
    try {
      run.summary = Json::parse(read_text(path));
    } catch (const Json::parse_error& e) {
      throw UserError(path.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!run.summary.is_object()) throw UserError(path.string() + ": expected a JSON object");
  }
  if (const fs::path path = dir / "recipe.yaml"; fs::is_regular_file(path)) run.recipe_text = read_text(path);
  if (const fs::path path = dir / "trace.json"; fs::is_regular_file(path)) {
    Json trace;
    try {
      trace = Json::parse(read_text(path));
    } catch (const Json::parse_error& e) {
      throw UserError(path.string() + ": not valid JSON (" + e.what() + ")");
    }
    run.breakdown = compute_breakdown(trace, path.string());
  }
  return run;
}

}  // namespace engine::report
