// What the offload equivalence tests run: every offload choice (where the optimizer state and the
// ZeRO-3 parameter shard live) at the ZeRO stages where it applies, in fp32 and bf16, each compared
// with the same run without offload, bit for bit. Small chunks (2048 parameters) so the streamed
// update crosses chunk and unit boundaries many times in the tiny quick-start model.
#pragma once

#include <string>
#include <vector>

#include "../checkpoint/resume_util.h"

namespace engine::testing {

struct OffloadCase {
  int stage;
  std::string optimizer, parameters, precision;
  bool lora = false;  // LoRA adapters on every linear layer (resume_util.h's kLoraOverrides)
};

inline void PrintTo(const OffloadCase& c, std::ostream* out) {
  *out << "stage " << c.stage << ", optimizer " << c.optimizer << ", parameters " << c.parameters << ", "
       << c.precision;
}

inline std::string offload_case_name(const ::testing::TestParamInfo<OffloadCase>& info) {
  const OffloadCase& c = info.param;
  return "stage" + std::to_string(c.stage) + "_optimizer_" + c.optimizer + "_parameters_" + c.parameters + "_" +
         c.precision + (c.lora ? "_lora" : "");
}

inline std::vector<OffloadCase> offload_cases() {
  std::vector<OffloadCase> cases;
  for (const char* precision : {"fp32", "bf16"}) {
    cases.push_back({0, "nvme", "none", precision});
    cases.push_back({0, "cpu", "none", precision});
    cases.push_back({2, "nvme", "none", precision});
    cases.push_back({3, "nvme", "none", precision});
    cases.push_back({3, "none", "nvme", precision});
    cases.push_back({3, "none", "cpu", precision});
    cases.push_back({3, "nvme", "nvme", precision});
    cases.push_back({3, "cpu", "cpu", precision});
  }
  // With LoRA only the adapters have optimizer state and a shard to offload.
  cases.push_back({0, "cpu", "none", "fp32", true});
  cases.push_back({3, "nvme", "nvme", "bf16", true});
  cases.push_back({3, "cpu", "cpu", "fp32", true});
  return cases;
}

// The case's recipe overrides without offload (the reference) and with it.
inline std::vector<std::string> reference_overrides(const OffloadCase& c) {
  std::vector<std::string> o{"precision.mode=" + c.precision, "distributed.zero_stage=" + std::to_string(c.stage),
                             "train.gradient_accumulation_steps=2"};
  if (c.lora) o.insert(o.end(), kLoraOverrides.begin(), kLoraOverrides.end());
  return o;
}

inline std::vector<std::string> offload_overrides(const OffloadCase& c, const std::filesystem::path& swap) {
  std::vector<std::string> o = reference_overrides(c);
  o.push_back("offload.optimizer=" + c.optimizer);
  o.push_back("offload.parameters=" + c.parameters);
  o.push_back("offload.nvme_path=" + swap.string());
  o.push_back("offload.chunk_size=2048");
  o.push_back("offload.block_size=8192");
  o.push_back("offload.queue_depth=4");
  return o;
}

// A run's trajectory without the offload counters that only offloaded runs log.
inline Trajectory offload_trajectory(const std::filesystem::path& run_dir) {
  Trajectory t = trajectory(run_dir);
  for (nlohmann::json& j : t.lines)
    for (const char* key :
         {"swap_read_per_step", "swap_written_per_step", "offload_chunks_per_step", "offload_parameter_bytes_per_step"})
      j.erase(key);
  return t;
}

// The run took the offload path: every step line counts the chunks its streamed update visited,
// and where a tier is nvme, bytes read from and written to the swap files; a setting that did
// nothing would log none of these.
inline void expect_offloaded(const std::filesystem::path& run_dir, const OffloadCase& c) {
  std::ifstream metrics(run_dir / "metrics.jsonl");
  int steps = 0;
  double chunks = 0, read = 0, written = 0, parameter_bytes = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss") || j.contains("event")) continue;
    ++steps;
    EXPECT_TRUE(j.contains("offload_chunks_per_step")) << line;
    chunks += j.value("offload_chunks_per_step", 0.0);
    read += j.value("swap_read_per_step", 0.0);
    written += j.value("swap_written_per_step", 0.0);
    parameter_bytes += j.value("offload_parameter_bytes_per_step", 0.0);
  }
  ASSERT_GT(steps, 0) << run_dir;
  const bool optimizer_offloaded = c.optimizer != "none";
  if (optimizer_offloaded) {
    EXPECT_GT(chunks, 0) << "the optimizer's update never ran chunked";
  }
  // ZeRO-3's gathers read the parameter shard from the offloaded store, in memory or on disk.
  if (c.parameters != "none") {
    EXPECT_GT(parameter_bytes, 0) << "no gather read the offloaded parameter shard";
  } else {
    EXPECT_EQ(parameter_bytes, 0) << "a gather read an offloaded shard that should not exist";
  }
  if (c.optimizer == "nvme" || c.parameters == "nvme") {
    EXPECT_GT(read, 0) << "nothing was read from a swap file";
    EXPECT_GT(written, 0) << "nothing was written to a swap file";
  } else {
    EXPECT_EQ(read + written, 0) << "host-memory offload touched a swap file";
  }
}

}  // namespace engine::testing
