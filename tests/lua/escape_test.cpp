// The escape suite: hostile plugins, each stopped with a clear message naming the plugin and the
// hook, and none reaching outside its sandbox. Each attack runs in on_step_start (an ordinary hook
// call under the ordinary limits); the time each took to stop is printed.
#include <chrono>
#include <cstdio>

#include "lua_test_util.h"

namespace engine::lua {
namespace {

using testing::load_plugin;
using testing::plugin_error;

struct Attack {
  const char* name;
  const char* code;      // the body of on_step_start
  const char* expected;  // in the error message
};

const Attack kAttacks[] = {
    {"os_execute", "os.execute('touch " ESCAPE_MARKER "')", "global 'os'"},
    {"io_open", "io.open('/etc/passwd'):read('a')", "global 'io'"},
    {"require", "require('os')", "global 'require'"},
    {"package_loadlib", "package.loadlib('libc.so.6', 'system')", "global 'package'"},
    {"dofile", "dofile('/etc/passwd')", "global 'dofile'"},
    {"loadfile", "loadfile('/etc/passwd')", "global 'loadfile'"},
    {"load_bytecode", "assert(load('\\27LuaT\\0\\25\\147\\r\\n\\26\\n'))", "attempt to load a binary chunk"},
    {"load_bytecode_mode_b", "assert(load('\\27LuaT\\0', 'x', 'b'))", "attempt to load a binary chunk"},
    {"string_dump", "string.dump(function() end)", "field 'dump'"},
    {"string_dump_via_metatable", "local s = ''; s.dump(print)", "field 'dump'"},
    {"debug_library", "debug.sethook()", "global 'debug'"},
    {"collectgarbage", "collectgarbage('stop')", "global 'collectgarbage'"},
    {"coroutine", "coroutine.wrap(function() end)()", "global 'coroutine'"},
    {"setmetatable_G", "setmetatable(_G, {__index = function() end})", "cannot change a protected metatable"},
    {"getmetatable_G", "getmetatable(_G).__index = {}", "attempt to index a string value"},
    {"string_metatable", "getmetatable('').__index = {}", "attempt to index a string value"},
    {"state_metatable", "getmetatable(state).__index.step = 1", "attempt to index a nil value (field '__index')"},
    {"state_setmetatable", "setmetatable(state, nil)", "cannot change a protected metatable"},
    {"state_rawset", "rawset(state, 'step', 1)", "rawset: this table is read-only"},
    {"state_write", "state.loss = 0", "state is read-only"},
    {"engine_replace", "engine.request_stop = nil", "engine is read-only"},
    {"gc_finalizer", "setmetatable({}, {__gc = function() while true do end end})",
     "__gc finalizers are not available"},
    {"infinite_loop", "while true do end", "exceeded its instruction budget"},
    {"loop_in_pcall", "while true do pcall(function() while true do end end) end", "exceeded its instruction budget"},
    {"loop_in_xpcall_handler", "xpcall(error, function() while true do end end)", "exceeded its instruction budget"},
    {"loop_after_budget_in_handler", "xpcall(function() while true do end end, function() while true do end end)",
     "exceeded its instruction budget"},
    {"loop_in_loaded_chunk", "load('while true do end')()", "exceeded its instruction budget"},
    {"recursion", "local function f() return f() + 1 end f()", "exceeded its memory limit"},
    {"string_rep_bomb", "local s = string.rep('x', 1 << 30)", "exceeded its memory limit"},
    {"string_rep_huge", "local s = string.rep('x', 1 << 62)", "resulting string too large"},
    {"string_rep_bomb_in_pcall", "while true do pcall(string.rep, 'x', 1 << 30) end", "exceeded its memory limit"},
    {"concat_bomb", "local s = 'x' while true do s = s .. s end", "exceeded its memory limit"},
    {"table_bomb", "local t = {} for i = 1, 1e12 do t[i] = {i} end", "exceeded its memory limit"},
    {"pattern_bomb", "string.find(string.rep('a', 60), string.rep('a-', 30) .. 'b')", "exceeded its time limit"},
    {"gsub_bomb", "string.gsub(string.rep('a', 60), string.rep('a*', 30) .. 'b', '')", "exceeded its time limit"},
    {"tostring_loop_error", "error(setmetatable({}, {__tostring = function() while true do end end}))",
     "error object is a table value"},
    {"tostring_error_error", "error(setmetatable({}, {__tostring = function() error('again') end}))",
     "error object is a table value"},
    {"error_nil", "error()", "error called with nil"},
    {"randomseed_clock", "math.randomseed()", "bad argument #1 to 'randomseed'"},
};

void PrintTo(const Attack& attack, std::ostream* out) { *out << attack.name; }

class Escape : public ::testing::TestWithParam<Attack> {};

TEST_P(Escape, IsStoppedWithAClearMessage) {
  const Attack& attack = GetParam();
  std::remove(ESCAPE_MARKER);
  auto plugin = load_plugin(std::string("function on_step_start(state)\n") + attack.code + "\nend\n");
  const auto start = std::chrono::steady_clock::now();
  std::string message = plugin_error([&] { plugin->on_step_start({}); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-26s stopped in %.3f s: %s\n", attack.name, seconds, message.substr(0, message.find('\n')).c_str());
  EXPECT_NE(message.find("plugin plugins/test.lua, on_step_start: "), std::string::npos) << message;
  EXPECT_NE(message.find(attack.expected), std::string::npos) << message;
  FILE* marker = std::fopen(ESCAPE_MARKER, "r");
  EXPECT_EQ(marker, nullptr) << "the plugin ran a command";
  if (marker) std::fclose(marker);
}

INSTANTIATE_TEST_SUITE_P(Lua, Escape, ::testing::ValuesIn(kAttacks),
                         [](const auto& test) { return std::string(test.param.name); });

// A plugin at its limits in one call is not stopped by work done in earlier calls: budgets are per call.
TEST(LuaLimits, BudgetIsPerCall) {
  Limits limits;
  limits.instructions = 2'000'000;
  auto plugin =
      load_plugin("function on_step_start(state) local x = 0 for i = 1, 100000 do x = x + i end end", {}, limits);
  for (int i = 0; i < 50; ++i) plugin->on_step_start({});  // 50 calls, well over the budget of one
}

// Memory freed is memory available again: the cap is on live allocations.
TEST(LuaLimits, MemoryCapIsOnLiveMemory) {
  // 120 MiB allocated in all, far less alive at once: under the 64 MiB cap. The time limit is
  // generous: this test is about memory, and sanitizer builds on a loaded machine are slow.
  Limits limits;
  limits.seconds = 30;
  auto plugin = load_plugin(
      "function on_step_start(state) for i = 1, 10 do local s = string.rep('x', 4 << 20) end end",
      nlohmann::json::object(), limits);
  for (int i = 0; i < 3; ++i) plugin->on_step_start({});
}

}  // namespace
}  // namespace engine::lua
