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

// The limit an attack is about. The other two limits are set far out of reach for its case, so the
// test does not depend on which limit a slow build (sanitizers, a loaded machine) reaches first.
enum class Subject { none, instructions, time, memory };

struct Attack {
  const char* name;
  const char* code;      // the body of on_step_start
  const char* expected;  // in the error message
  Subject subject = Subject::none;
};

constexpr auto I = Subject::instructions;
constexpr auto T = Subject::time;
constexpr auto M = Subject::memory;

// A to-be-closed value whose __close runs `body`.
#define CLOSING(body) "local closing <close> = setmetatable({}, {__close = function() " body " end}) "
#define LOOP "while true do end"
#define TABLE_BOMB "local t = {} for i = 1, 1e12 do t[i] = {i} end"

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
    {"gc_finalizer", "setmetatable({}, {__gc = function() " LOOP " end})", "__gc finalizers are not available"},
    // Finalizers run with hooks off, where no limit but the watchdog reaches them: a finalizer that
    // ran would hang the call until its state is abandoned ("inside a library function"). Each of
    // these must instead end at the instruction budget of the loop that feeds the collector.
    {"gc_finalizer_set_after_setmetatable",
     "local mt = {} local t = setmetatable({}, mt) mt.__gc = function() " LOOP " end t = nil "
     "while true do local garbage = {} end",
     "exceeded its instruction budget", I},
    {"gc_finalizer_rawset_after_setmetatable",
     "local mt = {} local t = setmetatable({}, mt) rawset(mt, '__gc', function() " LOOP " end) t = nil "
     "while true do local garbage = {} end",
     "exceeded its instruction budget", I},
    {"gc_finalizer_behind_index",
     "setmetatable({}, setmetatable({}, {__index = {__gc = function() " LOOP " end}})) "
     "while true do local garbage = {} end",
     "exceeded its instruction budget", I},
    // Each refusal costs a C++ throw, far more than the instructions it counts: the watchdog ends it.
    {"gc_finalizer_retried_in_pcall", "while true do pcall(setmetatable, {}, {__gc = function() " LOOP " end}) end",
     "exceeded its time limit", T},
    // To-be-closed variables: __close runs when the block ends, and while an error (a limit among
    // them) unwinds the stack; either way under the limits.
    {"close_loop", CLOSING(LOOP), "exceeded its instruction budget", I},
    {"close_loop_after_budget", CLOSING(LOOP) LOOP, "exceeded its instruction budget", I},
    {"close_loop_after_error", CLOSING(LOOP) "error('unwind')", "exceeded its instruction budget", I},
    {"close_loop_in_pcall", "while true do pcall(function() " CLOSING(LOOP) "error('x') end) end",
     "exceeded its instruction budget", I},
    {"close_loops_nested", CLOSING(LOOP) CLOSING(LOOP) CLOSING(LOOP) LOOP, "exceeded its instruction budget", I},
    {"close_loop_past_deadline", CLOSING(LOOP), "exceeded its time limit", T},
    {"close_alloc", CLOSING(TABLE_BOMB), "exceeded its memory limit", M},
    {"close_alloc_after_memory", CLOSING(TABLE_BOMB) "local s = string.rep('x', 1 << 30)", "exceeded its memory limit",
     M},
    {"close_concat_after_memory", CLOSING("local s = 'x' while true do s = s .. s end") TABLE_BOMB,
     "exceeded its memory limit", M},
    {"infinite_loop", LOOP, "exceeded its instruction budget", I},
    {"loop_in_pcall", "while true do pcall(function() " LOOP " end) end", "exceeded its instruction budget", I},
    {"loop_in_xpcall_handler", "xpcall(error, function() " LOOP " end)", "exceeded its instruction budget", I},
    {"loop_after_budget_in_handler", "xpcall(function() " LOOP " end, function() " LOOP " end)",
     "exceeded its instruction budget", I},
    {"loop_in_loaded_chunk", "load('" LOOP "')()", "exceeded its instruction budget", I},
    {"recursion", "local function f() return f() + 1 end f()", "exceeded its memory limit", M},
    {"string_rep_bomb", "local s = string.rep('x', 1 << 30)", "exceeded its memory limit", M},
    {"string_rep_huge", "local s = string.rep('x', 1 << 62)", "resulting string too large"},
    {"string_rep_bomb_in_pcall", "while true do pcall(string.rep, 'x', 1 << 30) end", "exceeded its memory limit", M},
    {"concat_bomb", "local s = 'x' while true do s = s .. s end", "exceeded its memory limit", M},
    {"table_bomb", TABLE_BOMB, "exceeded its memory limit", M},
    {"pattern_bomb", "string.find(string.rep('a', 60), string.rep('a-', 30) .. 'b')", "exceeded its time limit", T},
    {"gsub_bomb", "string.gsub(string.rep('a', 60), string.rep('a*', 30) .. 'b', '')", "exceeded its time limit", T},
    {"tostring_loop_error", "error(setmetatable({}, {__tostring = function() " LOOP " end}))",
     "error object is a table value"},
    {"tostring_error_error", "error(setmetatable({}, {__tostring = function() error('again') end}))",
     "error object is a table value"},
    {"error_nil", "error()", "error called with nil"},
    {"randomseed_clock", "math.randomseed()", "bad argument #1 to 'randomseed'"},
};

#undef CLOSING
#undef LOOP
#undef TABLE_BOMB

// The documented limit for the attack's subject; the others out of reach.
Limits limits_for(Subject subject) {
  const Limits documented;
  Limits limits;
  limits.instructions = int64_t(1) << 50;
  limits.seconds = 60;
  limits.memory_bytes = size_t(1) << 30;
  switch (subject) {
    case Subject::instructions:
      limits.instructions = documented.instructions;
      break;
    case Subject::time:
      limits.seconds = documented.seconds;
      break;
    case Subject::memory:
      limits.memory_bytes = documented.memory_bytes;
      break;
    case Subject::none:
      break;
  }
  return limits;
}

void PrintTo(const Attack& attack, std::ostream* out) { *out << attack.name; }

class Escape : public ::testing::TestWithParam<Attack> {};

TEST_P(Escape, IsStoppedWithAClearMessage) {
  const Attack& attack = GetParam();
  std::remove(ESCAPE_MARKER);
  auto plugin = load_plugin(std::string("function on_step_start(state)\n") + attack.code + "\nend\n",
                            nlohmann::json::object(), limits_for(attack.subject));
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

// A plugin at its limits in one call is not stopped by work done in earlier calls: budgets are per
// call. Each call's loop runs to its end; the same work in one call is stopped. The time limit is
// out of reach: this test is about instructions.
TEST(LuaLimits, BudgetIsPerCall) {
  Limits limits;
  limits.instructions = 2'000'000;
  limits.seconds = 60;
  const char* source =
      "saved = {calls = 0, sum = 0}\n"
      "function on_step_start(state)\n"
      "  local x = 0 for i = 1, 100000 * state.step do x = x + i end\n"
      "  saved.calls, saved.sum = saved.calls + 1, saved.sum + x\n"
      "end\n";
  auto plugin = load_plugin(source, nlohmann::json::object(), limits);
  TrainState one;
  one.step = 1;
  for (int i = 0; i < 50; ++i) plugin->on_step_start(one);  // 50 calls, well over the budget of one
  EXPECT_EQ(plugin->save_state(), (nlohmann::json{{"calls", 50}, {"sum", 50 * int64_t(5000050000)}}));

  TrainState fifty;  // the 50 calls' work in one call
  fifty.step = 50;
  std::string message = plugin_error([&] { plugin->on_step_start(fifty); });
  EXPECT_NE(message.find("exceeded its instruction budget of 2000000"), std::string::npos) << message;
}

// Memory freed is memory available again: the cap is on live allocations. 120 MiB allocated in
// all, few of them alive at once, passes the 64 MiB cap; keeping 20 of them alive (80 MiB) does
// not. The time limit is out of reach: this test is about memory.
TEST(LuaLimits, MemoryCapIsOnLiveMemory) {
  Limits limits;
  limits.seconds = 60;
  limits.instructions = int64_t(1) << 50;
  const char* source =
      "saved = {made = 0}\n"
      "local kept = {}\n"
      "function on_step_start(state)\n"
      "  for i = 1, state.step == 2 and 20 or 10 do\n"
      "    local s = string.rep('x', 4 << 20)\n"
      "    if state.step == 2 then kept[#kept + 1] = s end\n"
      "    saved.made = saved.made + 1\n"
      "  end\n"
      "end\n";
  auto plugin = load_plugin(source, nlohmann::json::object(), limits);
  TrainState freeing;
  freeing.step = 1;
  for (int i = 0; i < 3; ++i) plugin->on_step_start(freeing);
  EXPECT_EQ(plugin->save_state()["made"], 30);

  TrainState keeping;
  keeping.step = 2;
  std::string message = plugin_error([&] { plugin->on_step_start(keeping); });
  EXPECT_NE(message.find("exceeded its memory limit of 64 MiB"), std::string::npos) << message;
}

}  // namespace
}  // namespace engine::lua
