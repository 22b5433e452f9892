#include "lua/bindings.h"

#include <lua.hpp>

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "lua/sandbox.h"

namespace engine::lua {

namespace {

constexpr int kMaxDepth = 32;

Context& acting(lua_State* L, const char* function) {
  Context& c = Context::of(L);
  if (!c.allow_actions) luaL_error(L, "engine.%s is not available in %s", function, c.hook);
  return c;
}

std::string joined_arguments(lua_State* L) {
  std::string text;
  const int n = lua_gettop(L);
  for (int i = 1; i <= n; ++i) {
    size_t length = 0;
    const char* s = luaL_tolstring(L, i, &length);  // may run the plugin's __tostring: it is plugin code
    if (i > 1) text += '\t';
    text.append(s, length);
    lua_pop(L, 1);
  }
  return text;
}

int engine_log(lua_State* L) {
  Context& c = Context::of(L);
  std::string text = joined_arguments(L);
  c.pending.log.push_back(c.name + ": " + text);
  return 0;
}

int engine_metric(lua_State* L) {
  Context& c = acting(L, "metric");
  const char* name = luaL_checkstring(L, 1);
  const double value = luaL_checknumber(L, 2);
  if (!std::isfinite(value)) return luaL_error(L, "engine.metric: '%s' must be a finite number", name);
  if (!*name) return luaL_error(L, "engine.metric: the name is empty");
  // Under the plugin's own prefix: `loss` or `step` from a plugin must not read as the engine's.
  c.pending.metrics.emplace_back(plugin_metric_key(c.name, name), value);
  return 0;
}

int engine_request_stop(lua_State* L) {
  Context& c = acting(L, "request_stop");
  const char* reason = luaL_optstring(L, 1, "no reason given");
  if (!c.pending.stop) c.pending.stop = c.name + ": " + reason;
  return 0;
}

int engine_request_checkpoint(lua_State* L) {
  acting(L, "request_checkpoint").pending.checkpoint = true;
  return 0;
}

int engine_skip_step(lua_State* L) {
  Context& c = acting(L, "skip_step");
  if (!c.allow_skip)
    return luaL_error(L,
                      "engine.skip_step is only available in on_step_end (and on_anomaly before the update), "
                      "not in %s",
                      c.hook);
  const char* reason = luaL_optstring(L, 1, "no reason given");
  if (!c.pending.skip) c.pending.skip = c.name + ": " + reason;
  return 0;
}

int engine_set_lr(lua_State* L) {
  Context& c = acting(L, "set_lr");
  if (lua_isnoneornil(L, 1)) {
    c.pending.set_lr = std::optional<double>{};
    return 0;
  }
  const double lr = luaL_checknumber(L, 1);
  if (!std::isfinite(lr) || lr < 0) return luaL_error(L, "engine.set_lr: expected a finite number >= 0");
  c.pending.set_lr = std::optional<double>(lr);
  return 0;
}

void set_number(lua_State* L, const char* key, double value) {
  if (std::isnan(value))
    lua_pushnil(L);
  else
    lua_pushnumber(L, value);
  lua_setfield(L, -2, key);
}

void set_integer(lua_State* L, const char* key, int64_t value) {
  lua_pushinteger(L, static_cast<lua_Integer>(value));
  lua_setfield(L, -2, key);
}

}  // namespace

std::string plugin_metric_key(const std::string& plugin, const std::string& name) {
  return "plugin/" + std::filesystem::path(plugin).stem().string() + "/" + name;
}

void install_engine_api(lua_State* L) {
  const luaL_Reg functions[] = {{"log", engine_log},
                                {"metric", engine_metric},
                                {"request_stop", engine_request_stop},
                                {"request_checkpoint", engine_request_checkpoint},
                                {"skip_step", engine_skip_step},
                                {"set_lr", engine_set_lr},
                                {nullptr, nullptr}};
  luaL_newlib(L, functions);
  lua_pushstring(L, Context::of(L).name.c_str());
  lua_setfield(L, -2, "plugin");
  make_read_only(L, -1, "engine");
  lua_setglobal(L, "engine");
  lua_pushcfunction(L, engine_log);
  lua_setglobal(L, "print");
}

void push_state_proxy(lua_State* L, const nlohmann::json& recipe_values) {
  lua_newtable(L);
  push_json(L, recipe_values, true, "state.recipe");
  lua_setfield(L, -2, "recipe");
  lua_pushvalue(L, -1);
  Context::of(L).state_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  make_read_only(L, -1, "state");
}

void update_state(lua_State* L, const TrainState& s) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, Context::of(L).state_ref);
  set_integer(L, "step", s.step);
  set_integer(L, "epoch", s.epoch);
  set_integer(L, "tokens", s.tokens);
  set_number(L, "loss", s.loss);
  set_number(L, "lr", s.lr);
  set_number(L, "grad_norm", s.grad_norm);
  set_number(L, "loss_scale", s.loss_scale);
  set_number(L, "throughput", s.throughput);
  set_integer(L, "rank", s.rank);
  set_integer(L, "world_size", s.world_size);
  lua_pop(L, 1);
}

void push_metrics(lua_State* L, const Metrics& metrics) {
  lua_createtable(L, 0, static_cast<int>(metrics.size()));
  for (const auto& [name, value] : metrics) {  // NaN stays NaN here: a non-finite loss is news
    lua_pushnumber(L, value);
    lua_setfield(L, -2, name.c_str());
  }
}

void push_json(lua_State* L, const nlohmann::json& value, bool read_only, const char* what) {
  luaL_checkstack(L, 4, "nesting too deep");
  switch (value.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      lua_pushnil(L);
      return;
    case nlohmann::json::value_t::boolean:
      lua_pushboolean(L, value.get<bool>());
      return;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      lua_pushinteger(L, value.get<lua_Integer>());
      return;
    case nlohmann::json::value_t::number_float:
      lua_pushnumber(L, value.get<double>());
      return;
    case nlohmann::json::value_t::string: {
      const auto& s = value.get_ref<const std::string&>();
      lua_pushlstring(L, s.data(), s.size());
      return;
    }
    case nlohmann::json::value_t::array: {
      lua_createtable(L, static_cast<int>(value.size()), 0);
      lua_Integer i = 0;
      for (const auto& item : value) {
        push_json(L, item, read_only, what);
        lua_rawseti(L, -2, ++i);
      }
      break;
    }
    case nlohmann::json::value_t::object:
      lua_createtable(L, 0, static_cast<int>(value.size()));
      for (const auto& [key, item] : value.items()) {
        push_json(L, item, read_only, what);
        lua_setfield(L, -2, key.c_str());
      }
      break;
    case nlohmann::json::value_t::binary:
      lua_pushnil(L);
      return;
  }
  if (read_only) make_read_only(L, -1, what);
}

namespace {

nlohmann::json to_json_at(lua_State* L, int index, const std::string& path, int depth) {
  index = lua_absindex(L, index);
  switch (lua_type(L, index)) {
    case LUA_TNIL:
      return nullptr;
    case LUA_TBOOLEAN:
      return lua_toboolean(L, index) != 0;
    case LUA_TNUMBER: {
      if (lua_isinteger(L, index)) return static_cast<int64_t>(lua_tointeger(L, index));
      const double v = lua_tonumber(L, index);
      if (!std::isfinite(v)) throw std::runtime_error(path + " is " + std::to_string(v) + ", which JSON cannot hold");
      return v;
    }
    case LUA_TSTRING: {
      size_t length = 0;
      const char* s = lua_tolstring(L, index, &length);
      return std::string(s, length);
    }
    case LUA_TTABLE:
      break;
    default:
      throw std::runtime_error(path + " is a " + std::string(luaL_typename(L, index)) + ", which cannot be saved");
  }
  if (depth > kMaxDepth) throw std::runtime_error(path + " is nested more than 32 levels deep (a cycle?)");
  luaL_checkstack(L, 4, "nesting too deep");
  // Raw traversal: a plugin's __index/__pairs never runs here.
  const lua_Unsigned n = lua_rawlen(L, index);
  size_t count = 0;
  bool string_keys = true, integer_keys = true;
  lua_pushnil(L);
  while (lua_next(L, index)) {
    ++count;
    if (lua_type(L, -2) != LUA_TSTRING) string_keys = false;
    if (!lua_isinteger(L, -2)) integer_keys = false;
    lua_pop(L, 1);
  }
  if (count == 0) return nlohmann::json::object();
  if (integer_keys && count == n) {
    nlohmann::json array = nlohmann::json::array();
    for (lua_Unsigned i = 1; i <= n; ++i) {
      lua_rawgeti(L, index, static_cast<lua_Integer>(i));
      array.push_back(to_json_at(L, -1, path + "[" + std::to_string(i) + "]", depth + 1));
      lua_pop(L, 1);
    }
    return array;
  }
  if (!string_keys)
    throw std::runtime_error(path +
                             " mixes key types: a saved table is either a sequence (keys 1..n) or has "
                             "string keys");
  nlohmann::json object = nlohmann::json::object();
  lua_pushnil(L);
  while (lua_next(L, index)) {
    std::string key = lua_tostring(L, -2);
    object[key] = to_json_at(L, -1, path + "." + key, depth + 1);
    lua_pop(L, 1);
  }
  return object;
}

}  // namespace

nlohmann::json to_json(lua_State* L, int index, const std::string& what) { return to_json_at(L, index, what, 0); }

}  // namespace engine::lua
