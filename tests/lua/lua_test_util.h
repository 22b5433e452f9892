// Helpers for plugin tests: a plugin from inline source, written to a fresh temporary directory.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "../temp_dir.h"
#include "lua/plugin.h"

namespace engine::lua::testing {

// One directory per test, emptied the first time the test asks for it.
inline std::filesystem::path temp_dir() {
  static std::string prepared;
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(test->test_suite_name()) + "." + test->name();
  for (char& c : name)
    if (c == '/') c = '_';
  static const ::engine::testing::TempDir root("lua_test");
  auto dir = root / name;
  if (prepared != name) {
    std::filesystem::remove_all(dir);
    prepared = name;
  }
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::filesystem::path write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path;
}

// The documented limits with the wall clock out of reach: a test that is not about time must not
// fail because a slow build (sanitizers, a loaded machine) needed more than half a second.
inline Limits untimed_limits() {
  Limits limits;
  limits.seconds = 60;
  return limits;
}

// Loads `source` as plugins/test.lua and starts it with `args`.
inline std::unique_ptr<Plugin> load_plugin(const std::string& source,
                                           const nlohmann::json& args = nlohmann::json::object(),
                                           Limits limits = untimed_limits(), uint64_t seed = 1) {
  auto path = write_file(temp_dir() / "plugins" / "test.lua", source);
  auto plugin = std::make_unique<Plugin>(path, "plugins/test.lua", seed, limits);
  plugin->start(args, {{"train", {{"steps", 10}}}});
  return plugin;
}

// The message of the PluginError `f` throws; fails the test if it throws none.
template <class F>
std::string plugin_error(F&& f) {
  try {
    f();
  } catch (const PluginError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no PluginError";
  return "";
}

}  // namespace engine::lua::testing
