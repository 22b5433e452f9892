// `engine train` under mpirun from a test, and what a run leaves: its metrics lines with a loss,
// its final weights (safetensors, f32) and summary.json. Shared by the parallelism suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace engine::testing {

using Weights = std::map<std::string, std::vector<float>>;

struct Training {
  std::vector<nlohmann::json> steps;  // metrics lines with a loss
  Weights weights;                    // the final model.safetensors (f32)
  nlohmann::json summary;
  std::string output;
};

// A shell command's exit status (as pclose gives it) and its output, stderr included.
struct Shell {
  int status = 0;
  std::string output;
};
inline Shell shell(const std::string& command) {
  Shell result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  result.status = pclose(pipe);
  return result;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline Weights read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  Weights weights;
  if (bytes.size() < 8) return weights;
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const nlohmann::json index = nlohmann::json::parse(bytes.substr(8, header));
  for (const auto& [name, entry] : index.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(entry.at("dtype"), "F32") << name;
    const size_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    std::vector<float> values((end - begin) / 4);
    std::memcpy(values.data(), bytes.data() + 8 + header + begin, end - begin);
    weights[name] = std::move(values);
  }
  return weights;
}

// `engine train` of `recipe_and_overrides` on `world` ranks, 4 steps (`options`: --resume latest,
// --stop-after 2).
inline Training train(const std::string& recipe_and_overrides, int world, const std::string& dir,
                      const std::string& options = "") {
  const std::string launcher = world == 1
                                   ? std::string()
                                   : std::string(MPIEXEC) + " --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS " +
                                         MPIEXEC_NUMPROC_FLAG + " " + std::to_string(world) + " ";
  const std::string command = "OMP_NUM_THREADS=1 " + launcher + "'" ENGINE_BINARY "' train " SOURCE_DIR "/" +
                              recipe_and_overrides +
                              " train.steps=4 train.log_every=1 run.name=run run.output_dir=" + dir + " " + options;
  Training run;
  const Shell done = shell(command);
  run.output = done.output;
  EXPECT_EQ(done.status, 0) << command << "\n" << run.output;
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("grad_norm")) run.steps.push_back(j);
  }
  run.weights = read_safetensors(dir + "/run/model.safetensors");
  const std::string summary = read_file(dir + "/run/summary.json");
  if (!summary.empty()) run.summary = nlohmann::json::parse(summary);
  if (options.find("--stop-after") != std::string::npos) return run;  // cut: no final weights
  EXPECT_EQ(run.steps.size(), 4u) << command << "\n" << run.output;
  EXPECT_FALSE(run.weights.empty()) << command << "\n" << run.output;
  return run;
}

}  // namespace engine::testing
