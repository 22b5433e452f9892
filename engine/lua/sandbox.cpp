#include "lua/sandbox.h"

#include <lua.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace engine::lua {

namespace {

// The count hook runs every this many VM instructions: often enough to stop a loop within
// microseconds, rarely enough to cost nothing measurable.
constexpr int kHookEvery = 1000;
// After the deadline, how long Lua code gets to reach its next count hook before the thread is
// abandoned as stuck in a C function.
constexpr auto kGrace = std::chrono::milliseconds(300);

void* limited_alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* c = static_cast<Context*>(ud);
  const size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    std::free(ptr);
    c->bytes -= old;
    return nullptr;
  }
  if (nsize > old) {
    // Past the deadline nothing grows: a C function that allocates (string.rep, gsub, concat)
    // stops with a memory error, which the stop flag turns into the time-limit message.
    if (c->expired.load(std::memory_order_relaxed)) {
      if (c->stop == Context::Stop::none) c->stop = Context::Stop::time;
      return nullptr;
    }
    if (c->bytes - old + nsize > c->limits.memory_bytes) {
      if (c->stop == Context::Stop::none) c->stop = Context::Stop::memory;
      return nullptr;
    }
  }
  void* block = std::realloc(ptr, nsize);
  if (block) c->bytes = c->bytes - old + nsize;
  return block;
}

void count_hook(lua_State* L, lua_Debug* ar) {
  Context& c = Context::of(L);
  if (c.stop == Context::Stop::none) {
    c.instructions_left -= kHookEvery;
    if (c.instructions_left < 0 || !c.in_call)
      c.stop = Context::Stop::instructions;
    else if (c.expired.load(std::memory_order_relaxed))
      c.stop = Context::Stop::time;
    if (c.stop != Context::Stop::none && lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
      c.where = std::string(ar->short_src) + ":" + std::to_string(ar->currentline);
  }
  if (c.stop != Context::Stop::none) luaL_error(L, "plugin stopped by the engine");
}

// pcall and xpcall that cannot swallow the engine's stop: once a limit is exceeded the error
// propagates through every protected call up to the host.
int sandbox_pcall(lua_State* L) {
  luaL_checkany(L, 1);
  int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  if (status != LUA_OK && Context::of(L).stop != Context::Stop::none) return lua_error(L);
  lua_pushboolean(L, status == LUA_OK);
  lua_insert(L, 1);
  return lua_gettop(L);
}

// xpcall's handler runs after the unwinding, as an ordinary call: Lua would run it at the error
// point, where an error raised by the count hook leaves hooks off and the handler out of reach of
// the limits.
int sandbox_xpcall(lua_State* L) {
  const int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_rotate(L, 1, 1);  // handler, f, handler, args...
  lua_remove(L, 3);     // handler, f, args...
  int status = lua_pcall(L, n - 2, LUA_MULTRET, 0);
  if (status != LUA_OK) {
    if (Context::of(L).stop != Context::Stop::none) return lua_error(L);
    lua_pushvalue(L, 1);
    lua_insert(L, -2);  // handler, error
    lua_call(L, 1, 1);
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_replace(L, 1);
  return lua_gettop(L);
}

// load(chunk [, chunkname [, mode [, env]]]) with the mode forced to text: no bytecode.
int sandbox_load(lua_State* L) {
  const int n = lua_gettop(L);
  if (n < 3) lua_settop(L, 3);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  return lua_tocfunction(L, lua_upvalueindex(1))(L);
}

bool is_protected(lua_State* L, int index) {
  if (!lua_getmetatable(L, index)) return false;
  bool guarded = lua_getfield(L, -1, "__metatable") != LUA_TNIL;
  lua_pop(L, 2);
  return guarded;
}

int sandbox_rawset(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (is_protected(L, 1)) return luaL_error(L, "rawset: this table is read-only");
  return lua_tocfunction(L, lua_upvalueindex(1))(L);
}

// Finalizers run with hooks off, out of reach of the limits, so plugins cannot have them.
int sandbox_setmetatable(lua_State* L) {
  lua_settop(L, 2);
  lua_pushliteral(L, "__gc");
  if (lua_type(L, 2) == LUA_TTABLE && lua_rawget(L, 2) != LUA_TNIL)
    return luaL_error(L, "setmetatable: __gc finalizers are not available to plugins");
  lua_settop(L, 2);
  return lua_tocfunction(L, lua_upvalueindex(1))(L);
}

// math.randomseed needs a seed: without one Lua seeds from the clock, and runs stop repeating.
// The original is called as a closure: it keeps its generator's state in an upvalue of its own.
int sandbox_randomseed(lua_State* L) {
  luaL_checkinteger(L, 1);
  const int args = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, args, LUA_MULTRET);
  return lua_gettop(L);
}

void wrap(lua_State* L, const char* table, const char* name, lua_CFunction wrapper) {
  if (table)
    lua_getglobal(L, table);
  else
    lua_pushglobaltable(L);
  lua_getfield(L, -1, name);
  lua_pushcclosure(L, wrapper, 1);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

void remove(lua_State* L, const char* table, const char* name) {
  if (table)
    lua_getglobal(L, table);
  else
    lua_pushglobaltable(L);
  lua_pushnil(L);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

void protect_metatable(lua_State* L) {  // of the table on top
  lua_pushliteral(L, "protected");
  lua_setfield(L, -2, "__metatable");
}

int open_sandbox(lua_State* L) {
  const auto seed = static_cast<lua_Integer>(reinterpret_cast<uintptr_t>(lua_touserdata(L, 1)));
  const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                           {LUA_STRLIBNAME, luaopen_string},
                           {LUA_TABLIBNAME, luaopen_table},
                           {LUA_MATHLIBNAME, luaopen_math},
                           {LUA_UTF8LIBNAME, luaopen_utf8}};
  for (const auto& lib : libs) {
    luaL_requiref(L, lib.name, lib.func, 1);
    lua_pop(L, 1);
  }
  for (const char* name : {"dofile", "loadfile", "collectgarbage", "warn", "print"}) remove(L, nullptr, name);
  remove(L, LUA_STRLIBNAME, "dump");
  wrap(L, nullptr, "load", sandbox_load);
  wrap(L, nullptr, "rawset", sandbox_rawset);
  wrap(L, nullptr, "setmetatable", sandbox_setmetatable);
  lua_pushcfunction(L, sandbox_pcall);
  lua_setglobal(L, "pcall");
  lua_pushcfunction(L, sandbox_xpcall);
  lua_setglobal(L, "xpcall");

  lua_getglobal(L, LUA_MATHLIBNAME);
  lua_getfield(L, -1, "randomseed");
  lua_pushinteger(L, seed);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
  wrap(L, LUA_MATHLIBNAME, "randomseed", sandbox_randomseed);

  // _G's and the string metatable: protected, so getmetatable/setmetatable tricks find nothing.
  lua_pushglobaltable(L);
  lua_newtable(L);
  protect_metatable(L);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  protect_metatable(L);
  lua_pop(L, 2);
  return 0;
}

int read_only_newindex(lua_State* L) { return luaL_error(L, "%s is read-only", lua_tostring(L, lua_upvalueindex(1))); }

int read_only_pairs(lua_State* L) {
  lua_getglobal(L, "next");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushnil(L);
  return 3;
}

int read_only_len(lua_State* L) {
  lua_pushinteger(L, static_cast<lua_Integer>(lua_rawlen(L, lua_upvalueindex(1))));
  return 1;
}

int message_handler(lua_State* L) {
  std::string text = error_text(L, 1);
  luaL_traceback(L, L, text.c_str(), 1);
  return 1;
}

int protected_body(lua_State* L) {
  auto* body = static_cast<const Sandbox::Body*>(lua_touserdata(L, 1));
  lua_remove(L, 1);
  std::string failure;
  try {
    (*body)(L, Context::of(L));
    return 0;
  } catch (const std::exception& e) {  // Lua's own errors are not std::exceptions and pass on
    failure = e.what();
  }
  lua_pushstring(L, failure.c_str());
  return lua_error(L);
}

std::string limit_message(const Context& c) {
  std::string where = c.where.empty() ? "" : " (at " + c.where + ")";
  switch (c.stop) {
    case Context::Stop::instructions:
      return "exceeded its instruction budget of " + std::to_string(c.limits.instructions) +
             " Lua instructions per hook call" + where;
    case Context::Stop::time: {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", c.limits.seconds);
      return "exceeded its time limit of " + std::string(seconds) + " s per hook call" + where;
    }
    case Context::Stop::memory:
      return "exceeded its memory limit of " + std::to_string(c.limits.memory_bytes >> 20) + " MiB";
    case Context::Stop::none:
      break;
  }
  return "";
}

}  // namespace

Context& Context::of(lua_State* L) { return **static_cast<Context**>(lua_getextraspace(L)); }

std::string error_text(lua_State* L, int index) {
  switch (lua_type(L, index)) {
    case LUA_TSTRING: {
      size_t length = 0;
      const char* s = lua_tolstring(L, index, &length);
      return std::string(s, length);
    }
    case LUA_TNUMBER:
      lua_pushvalue(L, index);  // tostring on a copy: the original stays a number
      {
        std::string s = lua_tostring(L, -1);
        lua_pop(L, 1);
        return s;
      }
    case LUA_TNIL:
      return "error called with nil";
    default:
      return std::string("error object is a ") + luaL_typename(L, index) + " value";
  }
}

void make_read_only(lua_State* L, int index, const char* what) {
  index = lua_absindex(L, index);
  lua_newtable(L);           // proxy
  lua_createtable(L, 0, 5);  // metatable
  lua_pushvalue(L, index);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, what);
  lua_pushcclosure(L, read_only_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pushvalue(L, index);
  lua_pushcclosure(L, read_only_pairs, 1);
  lua_setfield(L, -2, "__pairs");
  lua_pushvalue(L, index);
  lua_pushcclosure(L, read_only_len, 1);
  lua_setfield(L, -2, "__len");
  lua_pushliteral(L, "read-only");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_replace(L, index);
}

// Everything the sandbox thread and its owner share. The thread holds a reference, so an
// abandoned sandbox's thread never touches freed memory.
struct Sandbox::Shared {
  Context context;
  lua_State* L = nullptr;
  std::mutex mutex;
  std::condition_variable wake, done;
  Body job;
  const char* job_hook = nullptr;
  bool has_job = false, job_done = false, quit = false;
  std::string job_error;

  void execute() {
    Context& c = context;
    c.hook = job_hook;
    c.instructions_left = c.limits.instructions;
    c.where.clear();
    c.in_call = true;
    lua_settop(L, 0);
    lua_pushcfunction(L, message_handler);
    lua_pushcfunction(L, protected_body);
    lua_pushlightuserdata(L, &job);
    int status = lua_pcall(L, 1, 0, 1);
    c.in_call = false;
    job_error.clear();
    const std::string head = "plugin " + c.name + ", " + job_hook + ": ";
    if (c.stop != Context::Stop::none) {
      job_error = head + "stopped: it " + limit_message(c);
    } else if (status == LUA_ERRMEM) {
      job_error = head + "out of memory";
    } else if (status != LUA_OK) {
      std::string text = error_text(L, -1);
      if (status == LUA_ERRERR) text = "error while handling an error: " + text;
      job_error = head + text;
    }
    lua_settop(L, 0);
  }

  void thread_main() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return has_job || quit; });
      if (!has_job) break;
      lock.unlock();
      execute();
      lock.lock();
      has_job = false;
      job_done = true;
      done.notify_one();
    }
  }
};

Sandbox::Sandbox(std::string name, Limits limits, uint64_t seed) : shared_(std::make_shared<Shared>()) {
  Shared& s = *shared_;
  s.context.name = std::move(name);
  s.context.limits = limits;
  s.L = lua_newstate(limited_alloc, &s.context);
  if (!s.L) throw PluginError("plugin " + s.context.name + ": cannot create a Lua state (out of memory)");
  *static_cast<Context**>(lua_getextraspace(s.L)) = &s.context;
  lua_sethook(s.L, count_hook, LUA_MASKCOUNT, kHookEvery);
  std::thread([shared = shared_] { shared->thread_main(); }).detach();
  run(
      [seed](lua_State* L, Context&) {
        lua_pushcfunction(L, open_sandbox);
        lua_pushlightuserdata(L, reinterpret_cast<void*>(static_cast<uintptr_t>(seed)));
        lua_call(L, 1, 0);
      },
      "setup");
}

Sandbox::~Sandbox() {
  std::unique_lock lock(shared_->mutex);
  // An idle thread is closed with its state; a thread stuck in a C function keeps its state
  // (leaked) and ends if it ever returns. No plugin code runs at close: __gc is refused.
  if (!shared_->has_job) {
    lua_close(shared_->L);
    shared_->L = nullptr;
  }
  shared_->quit = true;
  shared_->wake.notify_one();
}

void Sandbox::run(Body body, const char* hook) {
  Shared& s = *shared_;
  if (failed_) throw PluginError("plugin " + s.context.name + ": not called again after its failure");
  std::unique_lock lock(s.mutex);
  s.job = std::move(body);
  s.job_hook = hook;
  s.job_done = false;
  s.has_job = true;
  s.context.expired = false;
  s.wake.notify_one();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(s.context.limits.seconds);
  if (!s.done.wait_until(lock, deadline, [&] { return s.job_done; })) {
    s.context.expired = true;
    if (!s.done.wait_for(lock, kGrace, [&] { return s.job_done; })) {
      failed_ = true;
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", s.context.limits.seconds);
      throw PluginError("plugin " + s.context.name + ", " + hook + ": stopped: it exceeded its time limit of " +
                        seconds +
                        " s per hook call inside a library function (a pattern match, string.rep, "
                        "table.sort ...); its Lua state is abandoned");
    }
  }
  if (!s.job_error.empty()) {
    failed_ = true;
    throw PluginError(s.job_error);
  }
}

Context& Sandbox::context() { return shared_->context; }
const std::string& Sandbox::name() const { return shared_->context.name; }

}  // namespace engine::lua
