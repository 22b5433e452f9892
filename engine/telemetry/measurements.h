// Measurements: the keys of a metrics line that measure the machine (time, memory, utilisation)
// rather than the training. Two runs of the same recipe agree on every other key, bit for bit,
// which is what the equivalence and resume tests compare.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace engine {

inline bool is_measurement(const std::string& key) {
  static const std::set<std::string> keys = {
      "tokens_per_second",   "elapsed_s",     "step_time_s",          "mfu",       "hfu",
      "data_wait_s",         "cpu_util",      "process_cpu_util",     "core_util", "rss_bytes",
      "mem_available_bytes", "temperature_c", "swap_wait_s_per_step", "gpu_util",  "gpu_memory_used_bytes",
      "gpu_temperature_c",   "gpu_power_w"};
  return keys.count(key) > 0;
}

// `line` without them.
inline nlohmann::json without_measurements(nlohmann::json line) {
  for (auto it = line.begin(); it != line.end();) it = is_measurement(it.key()) ? line.erase(it) : std::next(it);
  return line;
}

}  // namespace engine
