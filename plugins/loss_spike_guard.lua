-- loss_spike_guard: skips the update of a step whose loss is a spike, as OLMo and llm.c do.
--
--   plugins: [{path: plugins/loss_spike_guard.lua, args: {window: 50, threshold: 6}}]
--
-- A spike is a loss more than `threshold` standard deviations above the mean of the last `window`
-- accepted losses (a z-score). Its update is not applied, the step is recorded (a metric and a
-- log line), and the spike does not enter the window. A non-finite loss is skipped the same way.
-- After `max_consecutive` skipped steps in a row the guard stops the run: the model is not
-- recovering by itself.

description = "Skips the update of steps whose loss z-score over a window exceeds a threshold."

params = {
  window = {type = "integer", default = 50, min = 2, help = "Accepted losses the mean and deviation are taken over."},
  threshold = {type = "number", default = 6, min = 0, help = "z-score above which a loss is a spike."},
  min_history = {type = "integer", default = 10, min = 2, help = "Losses needed before any step is judged."},
  max_consecutive = {type = "integer", default = 5, min = 1, help = "Spikes in a row that stop the run."},
}

saved = {losses = {}, skipped = 0, consecutive = 0}

local function mean_and_deviation(values)
  local sum, n = 0, #values
  for i = 1, n do sum = sum + values[i] end
  local mean = sum / n
  local squares = 0
  for i = 1, n do squares = squares + (values[i] - mean) ^ 2 end
  return mean, math.sqrt(squares / (n - 1))
end

local function skip(state, reason)
  saved.skipped = saved.skipped + 1
  saved.consecutive = saved.consecutive + 1
  engine.skip_step(reason)
  engine.metric("skipped", saved.skipped)
  if saved.consecutive >= args.max_consecutive then
    engine.request_stop(string.format("%d loss spikes in a row (last at step %d)", saved.consecutive, state.step))
  end
end

function on_step_end(state, metrics)
  local loss = metrics.loss
  if loss ~= loss or loss == math.huge or loss == -math.huge then
    skip(state, "non-finite loss")
    return
  end
  local losses = saved.losses
  if #losses >= args.min_history then
    local mean, deviation = mean_and_deviation(losses)
    local z = deviation > 0 and (loss - mean) / deviation or 0
    if z > args.threshold then
      skip(state, string.format("loss %.4f is %.1f standard deviations above the mean %.4f of the last %d steps",
                                loss, z, mean, #losses))
      engine.metric("z", z)
      return
    end
  end
  saved.consecutive = 0
  losses[#losses + 1] = loss
  if #losses > args.window then table.remove(losses, 1) end
end
