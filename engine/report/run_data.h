// A finished (or running) training run as `engine report` sees it: the numeric series of its
// metrics.jsonl, its summary.json and recipe.yaml, and the step-time breakdown of its trace.json.
//
// Every key is optional: a run directory from an older engine, a run cut short, or a run without
// telemetry still reports what it has. Only the directory itself and metrics.jsonl are required;
// a line that is not a JSON object is a UserError naming file:line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace engine::report {

// Points (step, value) in the order the run wrote them.
struct Series {
  std::vector<double> steps;
  std::vector<double> values;
  bool empty() const { return steps.empty(); }
};

// One row of a breakdown: a category or an op, its time per traced step and share of the step.
struct BreakdownRow {
  std::string name;
  double ms_per_step = 0;
  double percent = 0;
};

// Where rank 0's traced steps spent their time (trace.json, Chrome trace-event format).
struct Breakdown {
  int64_t steps = 0;                     // traced steps of rank 0
  double step_ms = 0;                    // mean duration of one traced step
  std::vector<BreakdownRow> categories;  // by event category, largest first; "untraced" is the rest
  std::vector<BreakdownRow> ops;         // "op" events by name: the largest kMaxOps, then "other ops"
  static constexpr size_t kMaxOps = 12;
};

struct RunData {
  std::filesystem::path dir;
  std::string label;                      // the directory as given on the command line: legends and table headers
  std::map<std::string, Series> metrics;  // numeric keys of the log lines (not step, not events)
  Series val_loss;                        // validation lines
  std::vector<double> checkpoint_steps;   // "event": "checkpoint"
  std::vector<double> overflow_steps;     // fp16 overflow lines (skipped updates)
  nlohmann::json summary = nlohmann::json::object();  // summary.json; empty while a run is unfinished
  std::string recipe_text;                            // recipe.yaml verbatim; empty when absent
  std::optional<Breakdown> breakdown;                 // from trace.json when present

  const Series* find(const std::string& key) const;
  // summary.json's number `key`, if present and numeric.
  std::optional<double> summary_number(const std::string& key) const;
};

// Reads `dir`; `label` names it in the report (default: the path as given, without a trailing '/').
RunData read_run(const std::filesystem::path& dir, const std::string& label = "");

// The breakdown of a parsed trace (rank 0's events); nullopt when it holds no rank-0 step event.
// `source` names the file in error messages.
std::optional<Breakdown> compute_breakdown(const nlohmann::json& trace, const std::string& source);

}  // namespace engine::report
