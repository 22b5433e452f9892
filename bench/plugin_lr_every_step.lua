-- For bench/plugin_overhead.sh: changes the learning rate at every step through engine.set_lr
-- (a slow sine wobble around the recipe's rate), so every step pays for a hook call and an action.
function on_step_start(state)
  engine.set_lr(state.recipe.optimizer.lr * (1 + 0.1 * math.sin(state.step / 10)))
end
