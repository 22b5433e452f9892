-- warmup_cosine: the learning-rate schedule as a plugin. Linear warmup from 0 to the base rate
-- (optimizer.lr), then cosine decay to min_lr, reached just after the last step: the numbers of the
-- built-in `scheduler: {type: cosine}`, to within one rounding (the compiled schedule may fuse a
-- multiply and an add).
--
--   plugins: [{path: plugins/warmup_cosine.lua, args: {warmup_steps: 30, min_lr: 0.0003}}]

description = "Linear warmup, then cosine decay to min_lr (the built-in cosine schedule, as a plugin)."

params = {
  warmup_steps = {type = "integer", default = 0, min = 0, help = "Steps of linear warmup from 0 to optimizer.lr."},
  min_lr = {type = "number", default = 0, min = 0, help = "Learning rate reached after the last step."},
}

-- step: updates already taken (0 for the first); base_lr: optimizer.lr.
function lr(step, base_lr, state)
  local warmup = args.warmup_steps
  if step < warmup then
    return base_lr * (step + 1) / warmup
  end
  -- The same operations in the same order as the engine's schedule.
  local decay_steps = state.recipe.train.steps - warmup
  local progress = (step - warmup) / decay_steps
  local factor = 0.5 * (1.0 + math.cos(math.pi * progress))
  return args.min_lr + (base_lr - args.min_lr) * factor
end
