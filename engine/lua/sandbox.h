// Sandbox: one Lua 5.4 state for one plugin, with a whitelisted environment and hard limits.
//
// The environment holds the base functions (load only for text chunks; no dofile, loadfile,
// collectgarbage or warn), `string` without `dump`, `table`, `math` (math.random seeded from the
// run seed) and `utf8`. There is no io, os, package, require, debug or coroutine. The metatables of
// _G, of strings and of every table the host hands out are protected; host tables are read-only.
//
// Every call into the plugin runs on the sandbox's own thread while the caller waits, under three
// limits per call (api.h Limits): an instruction budget (a count hook), a wall-clock deadline (the
// caller's timed wait is the watchdog: at the deadline Lua code raises an error at its next count
// hook and the allocator refuses memory; if a C function such as a pattern match still does not
// return, the thread and its state are abandoned) and a memory cap (the allocator refuses beyond it).
// Exceeding a limit, or any error in the plugin, throws PluginError naming the plugin, the hook and,
// for errors, file:line with a Lua traceback. After that the sandbox refuses further calls.
//
//   Sandbox box("plugins/x.lua", Limits{}, /*seed=*/1337);
//   box.run([](lua_State* L, Context& c) { ... lua_call(L, 0, 0); }, "load");
//
// A body may outlive the call when its sandbox is abandoned, so it must not reach the caller's
// stack: it captures values, and hands results back through the Context (which the thread keeps).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "lua/api.h"

struct lua_State;

namespace engine::lua {

// Per-state bookkeeping, reachable from C functions through lua_getextraspace.
struct Context {
  enum class Stop { none, instructions, time, memory };

  std::string name;  // the plugin as the recipe names it
  Limits limits;
  size_t bytes = 0;
  int64_t instructions_left = 0;
  std::atomic<bool> expired{false};  // set by the waiting caller at the deadline
  Stop stop = Stop::none;            // latched when a limit is exceeded
  std::string where;                 // file:line where the instruction budget or time ran out
  const char* hook = "load";
  bool in_call = false;

  // Plugin-layer state used by the `engine` API (bindings.cpp).
  PluginActions pending;
  Hook current = Hook::on_recipe;
  bool allow_actions = false;  // false in on_recipe and while loading: only engine.log works
  bool allow_skip = false;     // on_step_end, and on_anomaly before the update

  // Results of the last call, written by the body on the sandbox thread.
  double number = 0;
  bool has_number = false;
  nlohmann::json value;
  int hooks[kHookCount] = {};  // registry references of the hook functions; 0: not defined
  int state_ref = 0;           // the backing table of the read-only `state`
  int state_proxy = 0;         // the `state` table hooks receive

  static Context& of(lua_State* L);
};

class Sandbox {
 public:
  using Body = std::function<void(lua_State*, Context&)>;

  Sandbox(std::string name, Limits limits, uint64_t seed);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Runs `body` in protected mode on the sandbox thread under fresh limits and waits for it.
  // Lua errors raised inside become a PluginError naming `hook`; C++ exceptions derived from
  // std::exception thrown by `body` become Lua errors first.
  void run(Body body, const char* hook);

  // The context, for reading results after run() returned. Not to be used while a call runs.
  Context& context();
  const std::string& name() const;
  bool failed() const { return failed_; }

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  bool failed_ = false;
};

// Replaces the table at `index` by a read-only proxy: writes raise an error naming `what`, the
// metatable is protected, pairs() and # still see the table.
void make_read_only(lua_State* L, int index, const char* what);

// The message of the Lua error on top of the stack, without running any of the plugin's code
// (an error object's __tostring is never called).
std::string error_text(lua_State* L, int index);

}  // namespace engine::lua
