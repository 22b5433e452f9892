// read_with_tensorboard: an event file as TensorBoard's own Python reader sees it
// (tests/telemetry/read_events.py, run with the .venv that scripts/setup creates).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace engine::testing {

// Runs tests/telemetry/read_events.py on `file` with the virtual environment's Python and parses
// its JSON. The environment is part of the test setup (scripts/setup), so its absence fails.
inline nlohmann::json read_with_tensorboard(const std::filesystem::path& file) {
  const std::filesystem::path python = ENGINE_VENV_PYTHON;
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << python << " is missing: run scripts/setup (it creates .venv from scripts/requirements-test.txt)";
    return nlohmann::json();
  }
  const std::string command = python.string() + " " + READ_EVENTS_SCRIPT + " '" + file.string() + "'";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return nlohmann::json();
  }
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    ADD_FAILURE() << command << " exited with status " << status << "; stdout: " << out;
    return nlohmann::json();
  }
  return nlohmann::json::parse(out);
}

}  // namespace engine::testing
