// Synthetic run directories for the report tests: metrics.jsonl with every key the trainer writes
// (telemetry included), validation, checkpoint, resume and overflow lines, summary.json,
// recipe.yaml and a small Chrome trace with known durations.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace engine::testing {

// `variant` shifts the curves so that two runs compared on one page differ.
inline void write_run(const std::filesystem::path& dir, int variant = 0, bool trace = true) {
  using Json = nlohmann::json;
  std::filesystem::create_directories(dir);
  std::ofstream metrics(dir / "metrics.jsonl");
  const double v = variant;
  for (int step = 1; step <= 400; step += (step == 1 ? 4 : 5)) {
    const double t = step / 400.0;
    Json line{{"step", step},
              {"loss", 2.2 + 3.0 * std::exp(-6 * t) + 0.05 * std::sin(step * 0.7) + 0.15 * v},
              {"lr", (3e-4 - 1e-4 * v) * std::min(1.0, step / 40.0) * (0.55 + 0.45 * std::cos(M_PI * t))},
              {"grad_norm", (4.0 + 2 * v) * std::exp(-4 * t) + 0.3},
              {"tokens_per_second", 21000 + 1500 * std::sin(step * 0.13) - 4000 * v},
              {"elapsed_s", step * (0.09 + 0.02 * v)},
              {"step_time_s", 0.09 + 0.02 * v + 0.004 * std::sin(step * 0.3)},
              {"mfu", 0.31 - 0.06 * v + 0.01 * std::sin(step * 0.2)},
              {"hfu", 0.39 - 0.06 * v + 0.01 * std::sin(step * 0.2)},
              {"model_flops_per_step", 1.2e12},
              {"rss_bytes", (1.1 + 0.2 * v + 0.3 * t) * double(1 << 30)},
              {"mem_available_bytes", (5.5 - 0.3 * t - 0.5 * v) * double(1 << 30)},
              {"cpu_util", 82 + 6 * std::sin(step * 0.05) - 10 * v},
              {"process_cpu_util", 64 + 5 * std::sin(step * 0.05) - 10 * v},
              {"temperature_c", 55 + 10 * t + 2 * v},
              {"loss_scale", (step < 200 ? 65536.0 : 32768.0) / (1 + v)}};
    metrics << line.dump() << "\n";
    if (step % 50 == 0)
      metrics << Json{{"step", step}, {"val_loss", 2.3 + 2.8 * std::exp(-6 * t) + 0.15 * v}}.dump() << "\n";
    if (step % 100 == 0)
      metrics
          << Json{{"step", step}, {"event", "checkpoint"}, {"path", "checkpoints/step-" + std::to_string(step)}}.dump()
          << "\n";
    if (step == 200)
      metrics << Json{{"step", 201}, {"loss", 9.9}, {"overflow", true}, {"loss_scale", 65536}}.dump() << "\n";
  }
  metrics << Json{{"step", 200}, {"event", "resume"}}.dump() << "\n";

  std::ofstream(dir / "summary.json") << Json{
      {"steps", 400},
      {"final_loss", 2.25 + 0.15 * v},
      {"final_val_loss", 2.31 + 0.15 * v},
      {"loss_floor", 2.2},
      {"peak_rss_bytes", int64_t((1.45 + 0.2 * v) * double(1 << 30))},
      {"parameters", 6400000},
      {"world_size", 1},
      {"zero_stage", 0}}.dump(2);
  std::ofstream(dir / "recipe.yaml")
      << "run:\n  name: synthetic\nmodel:\n  arch: gpt\n  n_layer: 4\ntrain:\n  steps: 400\n";
  if (!trace) return;
  // Two traced steps of 100 ms (+10 ms per variant) on rank 0: 14 ops, communication, data,
  // optimizer; a step of rank 1 that must not count.
  Json events = Json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "rank 0"}}}});
  for (int s = 0; s < 2; ++s) {
    const double start = 1e6 * (s + 1), step_us = 100000 + 10000 * v;
    events.push_back({{"name", "step " + std::to_string(s + 1)},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", start},
                      {"dur", step_us},
                      {"pid", 0},
                      {"tid", 0}});
    double at = start;
    auto add = [&](const std::string& name, const std::string& cat, double dur) {
      events.push_back({{"name", name},
                        {"cat", cat},
                        {"ph", "X"},
                        {"ts", at},
                        {"dur", dur},
                        {"pid", 0},
                        {"tid", 0},
                        {"args", {{"flops", 1000}, {"bytes", 10}, {"node", 3}}}});
      at += dur;
    };
    add("data", "data", 5000);
    for (int op = 0; op < 14; ++op)
      add("op" + std::to_string(op), "op", 1000.0 * (14 - op) / 2 + 500 * v);  // 52.5 ms + 7v
    add("all_reduce", "communication", 12000);
    add("adamw", "optimizer", 20000);
  }
  events.push_back({{"name", "step 1"}, {"cat", "step"}, {"ph", "X"}, {"ts", 0}, {"dur", 5e6}, {"pid", 1}, {"tid", 0}});
  std::ofstream(dir / "trace.json") << Json{{"traceEvents", events}}.dump();
}

}  // namespace engine::testing
