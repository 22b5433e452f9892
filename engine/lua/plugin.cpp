#include "lua/plugin.h"

#include <lua.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/whole_file.h"
#include "lua/bindings.h"
#include "lua/params.h"
#include "lua/sandbox.h"
#include "recipe/export.h"
#include "recipe/suggest.h"

namespace engine::lua {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr size_t kMaxPluginBytes = 1 << 20;

const char* const kHookNames[kHookCount] = {"on_recipe",   "on_train_start", "on_step_start", "lr",
                                            "on_step_end", "on_eval",        "on_checkpoint", "on_anomaly",
                                            "on_train_end"};

std::string read_source(const fs::path& path, const std::string& name) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) throw UserError("plugin " + name + ": file not found: " + path.string());
  if (fs::file_size(path, error) > kMaxPluginBytes) throw UserError("plugin " + name + ": larger than 1 MiB");
  std::optional<std::string> text = read_whole_file(path);
  if (!text) throw UserError("plugin " + name + ": cannot read " + path.string());
  return std::move(*text);
}

std::string field_string(lua_State* L, int table, const char* key) {
  lua_getfield(L, table, key);
  std::string value;
  if (lua_type(L, -1) == LUA_TSTRING)
    value = lua_tostring(L, -1);
  else if (!lua_isnil(L, -1))
    throw std::runtime_error(std::string(key) + " must be a string");
  lua_pop(L, 1);
  return value;
}

// `params = {name = {type = ..., default = ..., ...}}` as JSON, checked for sense.
Json read_params(lua_State* L, int index) {
  index = lua_absindex(L, index);
  Json params = Json::array();
  static const std::vector<std::string> types = {"integer", "number", "string", "boolean", "list", "table"};
  lua_pushnil(L);
  while (lua_next(L, index)) {
    if (lua_type(L, -2) != LUA_TSTRING) throw std::runtime_error("params: keys must be parameter names");
    std::string name = lua_tostring(L, -2);
    const std::string where = "params." + name;
    if (lua_type(L, -1) != LUA_TTABLE) throw std::runtime_error(where + " must be a table {type = ..., ...}");
    const int spec = lua_gettop(L);
    Json p = to_json(L, spec, where);
    for (const auto& [key, value] : p.items())
      if (key != "type" && key != "default" && key != "min" && key != "max" && key != "choices" && key != "help")
        throw std::runtime_error(where + "." + key + ": unknown field (type, default, min, max, choices, help)");
    std::string type = field_string(L, spec, "type");
    if (std::find(types.begin(), types.end(), type) == types.end())
      throw std::runtime_error(where + ".type must be one of integer, number, string, boolean, list, table");
    for (const char* bound : {"min", "max"})
      if (p.contains(bound) && !p[bound].is_number())
        throw std::runtime_error(where + "." + bound + " must be a number");
    if (p.contains("choices") &&
        (!p["choices"].is_array() || p["choices"].empty() ||
         !std::all_of(p["choices"].begin(), p["choices"].end(), [](const Json& c) { return c.is_string(); })))
      throw std::runtime_error(where + ".choices must be a list of strings");
    Json out = {{"name", name}, {"type", type}, {"help", field_string(L, spec, "help")}};
    for (const char* key : {"default", "min", "max", "choices"})
      if (p.contains(key)) out[key] = p[key];
    if (out.contains("default")) {
      std::string problem = check_param_value(param_from_json(out), out["default"]);
      if (!problem.empty()) throw std::runtime_error(where + ".default: " + problem);
    }
    params.push_back(out);
    lua_pop(L, 1);
  }
  std::sort(params.begin(), params.end(), [](const Json& a, const Json& b) { return a["name"] < b["name"]; });
  return params;
}

}  // namespace

const char* hook_name(Hook hook) { return kHookNames[static_cast<int>(hook)]; }

const std::vector<std::string>& hook_names() {
  static const std::vector<std::string> names(kHookNames, kHookNames + kHookCount);
  return names;
}

void PluginActions::merge(PluginActions other) {
  for (auto& line : other.log) log.push_back(std::move(line));
  for (auto& metric : other.metrics) metrics.push_back(std::move(metric));
  if (!stop) stop = std::move(other.stop);
  checkpoint |= other.checkpoint;
  if (!skip) skip = std::move(other.skip);
  if (other.set_lr) set_lr = other.set_lr;  // the later plugin has the last word
}

struct Plugin::Call {
  Hook hook;
  TrainState state;
  Metrics metrics;
  std::string text;
  AnomalyEvent event;
  int64_t step = 0;
  double base_lr = 0;
  Json json;
};

Plugin::Plugin(const fs::path& path, std::string name, uint64_t seed, Limits limits) : seed_(seed) {
  std::string source = read_source(path, name);
  sandbox_ = std::make_unique<Sandbox>(name, limits, seed);
  info_.name = name;
  sandbox_->run(
      [source = std::move(source), chunk = "@" + name](lua_State* L, Context& c) {
        install_engine_api(L);
        if (luaL_loadbufferx(L, source.data(), source.size(), chunk.c_str(), "t") != LUA_OK) lua_error(L);
        lua_call(L, 0, 0);
        Json info = {{"unknown", Json::array()}};
        lua_pushglobaltable(L);
        const int globals = lua_gettop(L);
        for (int i = 0; i < kHookCount; ++i) {
          if (lua_getfield(L, globals, kHookNames[i]) == LUA_TFUNCTION)
            c.hooks[i] = luaL_ref(L, LUA_REGISTRYINDEX);
          else
            lua_pop(L, 1);
        }
        lua_pushnil(L);
        while (lua_next(L, globals)) {
          if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TFUNCTION) {
            std::string key = lua_tostring(L, -2);
            if (key.rfind("on_", 0) == 0 &&
                std::find(hook_names().begin(), hook_names().end(), key) == hook_names().end())
              info["unknown"].push_back(key);
          }
          lua_pop(L, 1);
        }
        info["description"] = field_string(L, globals, "description");
        lua_getfield(L, globals, "params");
        info["declares_params"] = !lua_isnil(L, -1);
        if (lua_type(L, -1) == LUA_TTABLE)
          info["params"] = read_params(L, -1);
        else if (!lua_isnil(L, -1))
          throw std::runtime_error("params must be a table of parameter declarations");
        c.value = std::move(info);
      },
      "load");
  Context& c = sandbox_->context();
  info_.description = c.value["description"];
  info_.declares_params = c.value["declares_params"];
  for (const Json& p : c.value.value("params", Json::array())) info_.params.push_back(param_from_json(p));
  for (int i = 0; i < kHookCount; ++i)
    if (c.hooks[i]) info_.hooks.push_back(static_cast<Hook>(i));
  for (const Json& unknown : c.value["unknown"]) info_.unknown_hooks.push_back(unknown);
  c.value = nullptr;
}

Plugin::~Plugin() = default;

bool Plugin::has(Hook hook) const {
  return std::find(info_.hooks.begin(), info_.hooks.end(), hook) != info_.hooks.end();
}

void Plugin::start(const Json& args, const Json& recipe_values) {
  sandbox_->run(
      [args, recipe_values](lua_State* L, Context& c) {
        push_json(L, args.is_null() ? Json::object() : args, true, "args");
        lua_setglobal(L, "args");
        push_state_proxy(L, recipe_values);
        c.state_proxy = luaL_ref(L, LUA_REGISTRYINDEX);
      },
      "start");
}

PluginActions Plugin::invoke(Hook which, const TrainState& state, std::shared_ptr<const Call> call) {
  if (!has(which)) return {};
  // math.random restarts at every hook call from (seed, step, hook): a counter-based stream, so a
  // run resumed from a checkpoint draws what the uninterrupted run drew.
  const uint64_t stream = seed_ ^ (uint64_t(state.step) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(which) << 56);
  sandbox_->run(
      [call, state, stream](lua_State* L, Context& c) {
        const Hook hook = call->hook;
        lua_getglobal(L, LUA_MATHLIBNAME);
        if (lua_getfield(L, -1, "randomseed") == LUA_TFUNCTION) {
          lua_pushinteger(L, static_cast<lua_Integer>(stream));
          lua_call(L, 1, 0);
          lua_pop(L, 1);
        } else {
          lua_pop(L, 2);
        }
        c.pending = PluginActions{};
        c.current = hook;
        c.allow_actions = hook != Hook::on_recipe;
        c.allow_skip = hook == Hook::on_step_end || (hook == Hook::on_anomaly && call->event.before_update);
        c.value = nullptr;
        lua_rawgeti(L, LUA_REGISTRYINDEX, c.hooks[static_cast<int>(hook)]);
        int nargs = 2;
        if (hook == Hook::on_recipe) {
          push_json(L, call->json);
          nargs = 1;
        } else {
          update_state(L, state);
          if (hook == Hook::lr) {
            lua_pushinteger(L, call->step);
            lua_pushnumber(L, call->base_lr);
          }
          lua_rawgeti(L, LUA_REGISTRYINDEX, c.state_proxy);
          switch (hook) {
            case Hook::on_step_end:
            case Hook::on_eval:
            case Hook::on_train_end:
              push_metrics(L, call->metrics);
              break;
            case Hook::on_checkpoint:
              lua_pushstring(L, call->text.c_str());
              break;
            case Hook::on_anomaly: {
              const AnomalyEvent& e = call->event;
              lua_createtable(L, 0, 5);
              lua_pushstring(L, e.kind.c_str());
              lua_setfield(L, -2, "kind");
              lua_pushinteger(L, e.step);
              lua_setfield(L, -2, "step");
              lua_pushnumber(L, e.value);
              lua_setfield(L, -2, "value");
              lua_pushstring(L, e.detail.c_str());
              lua_setfield(L, -2, "detail");
              lua_pushboolean(L, e.before_update);
              lua_setfield(L, -2, "before_update");
              break;
            }
            case Hook::lr:
              nargs = 3;
              break;
            default:
              nargs = 1;
          }
        }
        lua_call(L, nargs, 1);
        if (hook == Hook::lr) {
          if (lua_type(L, -1) != LUA_TNUMBER)
            throw std::runtime_error(std::string("lr must return a number, returned ") + luaL_typename(L, -1));
          c.number = lua_tonumber(L, -1);
          if (!std::isfinite(c.number) || c.number < 0)
            throw std::runtime_error("lr returned " + std::to_string(c.number) + "; expected a finite number >= 0");
        } else if (hook == Hook::on_recipe && !lua_isnil(L, -1)) {
          if (!lua_istable(L, -1)) throw std::runtime_error("on_recipe must return a table of changes or nothing");
          c.value = to_json(L, -1, "the changes");
        }
      },
      hook_name(which));
  return std::move(sandbox_->context().pending);
}

Json Plugin::on_recipe(const Json& recipe) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_recipe;
  call->json = recipe;
  invoke(Hook::on_recipe, {}, call);
  return has(Hook::on_recipe) ? std::move(sandbox_->context().value) : Json();
}

PluginActions Plugin::on_train_start(const TrainState& state) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_train_start;
  return invoke(Hook::on_train_start, state, std::move(call));
}

PluginActions Plugin::on_step_start(const TrainState& state) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_step_start;
  return invoke(Hook::on_step_start, state, std::move(call));
}

double Plugin::lr(int64_t step, double base_lr, const TrainState& state, PluginActions& actions) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::lr;
  call->step = step;
  call->base_lr = base_lr;
  actions.merge(invoke(Hook::lr, state, std::move(call)));
  return sandbox_->context().number;
}

PluginActions Plugin::on_step_end(const TrainState& state, const Metrics& metrics) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_step_end;
  call->metrics = metrics;
  return invoke(Hook::on_step_end, state, std::move(call));
}

PluginActions Plugin::on_eval(const TrainState& state, const Metrics& metrics) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_eval;
  call->metrics = metrics;
  return invoke(Hook::on_eval, state, std::move(call));
}

PluginActions Plugin::on_checkpoint(const TrainState& state, const std::string& path) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_checkpoint;
  call->text = path;
  return invoke(Hook::on_checkpoint, state, std::move(call));
}

PluginActions Plugin::on_anomaly(const TrainState& state, const AnomalyEvent& event) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_anomaly;
  call->event = event;
  return invoke(Hook::on_anomaly, state, std::move(call));
}

PluginActions Plugin::on_train_end(const TrainState& state, const Metrics& summary) {
  auto call = std::make_shared<Call>();
  call->hook = Hook::on_train_end;
  call->metrics = summary;
  return invoke(Hook::on_train_end, state, std::move(call));
}

Json Plugin::save_state() {
  sandbox_->run(
      [](lua_State* L, Context& c) {
        lua_getglobal(L, "saved");
        c.value = to_json(L, -1, "saved");
      },
      "save_state");
  return std::move(sandbox_->context().value);
}

void Plugin::restore_state(const Json& saved) {
  sandbox_->run(
      [saved](lua_State* L, Context&) {
        push_json(L, saved);
        lua_setglobal(L, "saved");
      },
      "restore_state");
}

}  // namespace engine::lua
