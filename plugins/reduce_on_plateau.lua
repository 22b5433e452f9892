-- reduce_on_plateau: multiplies the learning rate by `factor` when the validation loss stops
-- improving, checkpoints each new best, and reports what it did at the end. It shows most of the
-- API: on_recipe makes sure evaluation is on, on_eval acts with set_lr and request_checkpoint,
-- on_checkpoint and on_anomaly log, on_train_end summarises, and `saved` survives resume.
--
--   plugins: [{path: plugins/reduce_on_plateau.lua, args: {patience: 2, factor: 0.5}}]

description = "Reduces the learning rate when the validation loss plateaus; checkpoints each new best."

params = {
  patience = {type = "integer", default = 2, min = 1, help = "Evaluations without improvement before reducing."},
  factor = {type = "number", default = 0.5, min = 0, max = 1, help = "Multiplier applied to the learning rate."},
  min_lr = {type = "number", default = 0, min = 0, help = "The learning rate never goes below this."},
  eval_every = {type = "integer", default = 50, min = 1, help = "train.eval_every to use when the recipe has none."},
  checkpoint_best = {type = "boolean", default = true, help = "Ask for a checkpoint at each new best."},
}

saved = {bad = 0, reductions = 0, checkpoints = 0}

function on_recipe(recipe)
  if recipe.train.eval_every == 0 then
    engine.log("evaluation is off in the recipe; turning it on every " .. args.eval_every .. " steps")
    return {train = {eval_every = args.eval_every}}
  end
end

function on_train_start(state)
  saved.lr = saved.lr or state.recipe.optimizer.lr
  engine.log(string.format("watching val_loss; patience %d, factor %g", args.patience, args.factor))
end

function on_eval(state, metrics)
  local loss = metrics.val_loss
  if saved.best == nil or loss < saved.best then
    saved.best, saved.bad = loss, 0
    if args.checkpoint_best then engine.request_checkpoint() end
    return
  end
  saved.bad = saved.bad + 1
  if saved.bad >= args.patience then
    saved.lr = math.max(args.min_lr, (state.lr or saved.lr) * args.factor)
    saved.bad = 0
    saved.reductions = saved.reductions + 1
    engine.set_lr(saved.lr)
    engine.metric("lr", saved.lr)
    engine.log(string.format("val_loss %.4f has not improved on %.4f: learning rate now %.3g", loss, saved.best,
                             saved.lr))
  end
end

function on_checkpoint(state, path)
  saved.checkpoints = saved.checkpoints + 1
  engine.log("checkpoint of the best model so far: " .. path)
end

function on_anomaly(state, event)
  engine.log(string.format("anomaly at step %d: %s (%s)", event.step, event.kind, event.detail))
end

function on_train_end(state, summary)
  engine.log(string.format("best val_loss %s; %d learning-rate reductions; %d checkpoints",
                           saved.best and string.format("%.4f", saved.best) or "none", saved.reductions,
                           saved.checkpoints))
end
