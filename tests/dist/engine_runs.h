// `engine train` under mpirun from a test, and what a run leaves: its metrics lines with a loss,
// its final weights (safetensors, f32) and summary.json. Shared by the parallelism suites.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
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

// The weights a tolerance applies to: GPT's key bias (rows [C, 2C) of c_attn.bias) left out.
inline std::vector<float> compared(const std::string& name, const std::vector<float>& values) {
  const std::string key_bias = "attn.c_attn.bias";
  if (name.size() < key_bias.size() || name.compare(name.size() - key_bias.size(), key_bias.size(), key_bias) != 0)
    return values;
  const size_t c = values.size() / 3;
  std::vector<float> kept(values.begin(), values.begin() + long(c));
  kept.insert(kept.end(), values.begin() + long(2 * c), values.end());
  return kept;
}

inline double max_abs_difference(const Weights& a, const Weights& b, std::string* where) {
  double worst = 0;
  for (const auto& [name, values] : a) {
    auto other = b.find(name);
    if (other == b.end() || other->second.size() != values.size()) {
      ADD_FAILURE() << name << " is missing or has another size in the split run's weights";
      continue;
    }
    const std::vector<float> x = compared(name, values), y = compared(name, other->second);
    for (size_t i = 0; i < x.size(); ++i)
      if (std::abs(double(x[i]) - double(y[i])) > worst) {
        worst = std::abs(double(x[i]) - double(y[i]));
        *where = name;
      }
  }
  return worst;
}

inline double l2_difference(const Weights& a, const Weights& b) {
  double sum = 0;
  for (const auto& [name, values] : a)
    if (auto other = b.find(name); other != b.end() && other->second.size() == values.size())
      for (size_t i = 0; i < values.size(); ++i) sum += std::pow(double(values[i]) - double(other->second[i]), 2);
  return std::sqrt(sum);
}

// fp32: a split run against one process, within the reordering tolerances of
// tensor_parallel_test.cpp: losses within 1e-6 relative, gradient norms 1e-5, weights 1e-2 of lr x steps.
inline void expect_close_fp32(const Training& split, const Training& whole, double lr, const std::string& what) {
  ASSERT_EQ(split.steps.size(), whole.steps.size()) << what;
  for (size_t s = 0; s < whole.steps.size(); ++s) {
    const double loss = whole.steps[s]["loss"], norm = whole.steps[s]["grad_norm"];
    EXPECT_NEAR(split.steps[s]["loss"].get<double>(), loss, 1e-6 * loss) << what << ", step " << s + 1;
    EXPECT_NEAR(split.steps[s]["grad_norm"].get<double>(), norm, 1e-5 * norm) << what << ", step " << s + 1;
  }
  std::string where;
  const double worst = max_abs_difference(whole.weights, split.weights, &where);
  EXPECT_LE(worst, 1e-2 * lr * double(whole.steps.size())) << what << ": final weight of " << where;
}

// 16-bit (bf16, fp16): a split run against one process in the same precision, within twice the
// distance of that run from fp32's (tensor_parallel_test.cpp derives it).
inline void expect_close_16bit(const Training& split, const Training& whole, const Training& whole_fp32,
                               const std::string& what) {
  ASSERT_EQ(split.steps.size(), whole.steps.size()) << what;
  double split_loss = 0, own_loss = 0;
  for (size_t s = 0; s < whole.steps.size(); ++s) {
    const double loss = whole.steps[s]["loss"];
    split_loss = std::max(split_loss, std::abs(split.steps[s]["loss"].get<double>() - loss));
    own_loss = std::max(own_loss, std::abs(whole_fp32.steps[s]["loss"].get<double>() - loss));
  }
  EXPECT_LE(split_loss, 2 * own_loss) << what << ": the losses' largest difference";
  EXPECT_GT(own_loss, 0) << what << ": 16-bit and fp32 trained the same bits";
  EXPECT_LE(l2_difference(whole.weights, split.weights), 2 * l2_difference(whole.weights, whole_fp32.weights))
      << what << ": the final weights";
}

}  // namespace engine::testing
