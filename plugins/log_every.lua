-- log_every: custom metrics every `every` steps: an exponential moving average of the loss,
-- tokens seen, throughput and the learning rate, written to metrics.jsonl and printed.
--
--   plugins: [{path: plugins/log_every.lua, args: {every: 10, smoothing: 0.9}}]

description = "Records the loss's moving average, tokens seen, throughput and lr every `every` steps."

params = {
  every = {type = "integer", default = 10, min = 1, help = "Steps between records."},
  smoothing = {type = "number", default = 0.9, min = 0, max = 1, help = "Weight of the past in the moving average."},
  print = {type = "boolean", default = true, help = "Also print a line to the log."},
}

saved = {}

function on_step_end(state, metrics)
  if metrics.loss == metrics.loss then  -- a NaN would poison the average
    saved.ema = saved.ema and args.smoothing * saved.ema + (1 - args.smoothing) * metrics.loss or metrics.loss
  end
  if state.step % args.every ~= 0 then return end
  engine.metric("loss_ema", saved.ema)
  engine.metric("tokens_seen", state.tokens)
  engine.metric("tokens_per_second", state.throughput)
  engine.metric("lr", metrics.lr)
  if args.print then
    engine.log(string.format("step %d: loss (moving average) %.4f, %d tokens, lr %.3g", state.step, saved.ema,
                             state.tokens, metrics.lr))
  end
end
