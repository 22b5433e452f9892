// Bindings: the values and functions the host puts into a plugin's Lua state.
//
//   engine            the narrow API to act: log, metric, request_stop, request_checkpoint,
//                     skip_step, set_lr (recorded in Context::pending, applied by the trainer)
//   state             a read-only view of training (api.h TrainState), one table updated per call
//   args, recipe      read-only tables made from JSON
//
// And JSON in both directions, for arguments, on_recipe's changes and the plugin's saved state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lua/api.h"

struct lua_State;

namespace engine::lua {

// Defines the global `engine` table and `print` (which writes through engine.log).
void install_engine_api(lua_State* L);

// Creates the `state` proxy as the global `state_view` is not needed: returns nothing, keeps the
// backing table's reference in Context::state_ref and leaves the proxy on the stack.
void push_state_proxy(lua_State* L, const nlohmann::json& recipe_values);
// Writes `state` into the backing table (Context::state_ref).
void update_state(lua_State* L, const TrainState& state);

// JSON to Lua: objects become tables, arrays sequences, null nil. With read_only, every table
// (nested ones too) is a read-only proxy named `what`.
void push_json(lua_State* L, const nlohmann::json& value, bool read_only = false, const char* what = "table");
// Lua to JSON: nil, booleans, integers, finite numbers, strings, sequences (keys 1..n) and tables
// with string keys. Anything else throws std::runtime_error naming the path (`what.key.key`).
nlohmann::json to_json(lua_State* L, int index, const std::string& what);

void push_metrics(lua_State* L, const Metrics& metrics);

}  // namespace engine::lua
