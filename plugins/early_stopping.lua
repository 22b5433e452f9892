-- early_stopping: stops the run when an evaluation metric has stopped improving.
--
--   train: {eval_every: 50}
--   plugins: [{path: plugins/early_stopping.lua, args: {patience: 5, metric: val_loss}}]
--
-- Lower is better. After `patience` evaluations in a row without an improvement of at least
-- min_delta, it asks the engine to stop; the run ends after the current step and saves its weights.

description = "Stops the run when an evaluation metric has not improved for `patience` evaluations."

params = {
  patience = {type = "integer", default = 5, min = 1, help = "Evaluations without improvement before stopping."},
  metric = {type = "string", default = "val_loss", help = "The evaluation metric to watch; lower is better."},
  min_delta = {type = "number", default = 0, min = 0, help = "Smaller improvements do not count."},
}

-- Kept with checkpoints, so a resumed run remembers its best value and patience.
saved = {bad = 0}

function on_eval(state, metrics)
  local value = metrics[args.metric]
  if value == nil then
    error("no metric '" .. args.metric .. "' in this evaluation")
  end
  if saved.best == nil or value < saved.best - args.min_delta then
    saved.best, saved.bad = value, 0
  else
    saved.bad = saved.bad + 1
    engine.log(string.format("%s %.4f: no improvement on %.4f for %d of %d evaluations", args.metric, value,
                             saved.best, saved.bad, args.patience))
    if saved.bad >= args.patience then
      engine.request_stop(string.format("%s has not improved on %.4f for %d evaluations", args.metric, saved.best,
                                        saved.bad))
    end
  end
  engine.metric("best", saved.best)
end
