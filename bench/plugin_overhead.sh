#!/usr/bin/env bash
# The cost of Lua plugins on the quick start: mean step time without plugins, with a plugin that
# replaces the schedule (plugins/warmup_cosine.lua, an lr hook call every step) and with one that
# calls engine.set_lr every step (bench/plugin_lr_every_step.lua). Runs are interleaved and
# repeated; the table shows the fastest run of each (on a shared machine the least disturbed one)
# and the median.
#
#   bench/plugin_overhead.sh [ENGINE] [REPEATS]      # defaults: build/engine, 5
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:-build/engine}
repeats=${2:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cat > "$out/none.yaml" <<YAML
base: $PWD/recipes/quickstart.yaml
run: {output_dir: $out/runs, name: none}
train: {eval_every: 0}
YAML
cat > "$out/schedule.yaml" <<YAML
base: $PWD/recipes/quickstart.yaml
run: {output_dir: $out/runs, name: schedule}
train: {eval_every: 0}
plugins: [{path: $PWD/plugins/warmup_cosine.lua, args: {warmup_steps: 30, min_lr: 0.0003}}]
YAML
cat > "$out/set_lr.yaml" <<YAML
base: $PWD/recipes/quickstart.yaml
run: {output_dir: $out/runs, name: set_lr}
train: {eval_every: 0}
plugins: [$PWD/bench/plugin_lr_every_step.lua]
YAML

# Seconds from the first to the last step, over the steps in between: the last metrics line's
# elapsed_s counts from the start of the loop.
step_ms() { python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if "elapsed_s" in l]
print(1000 * (lines[-1]["elapsed_s"] - lines[0]["elapsed_s"]) / (lines[-1]["step"] - lines[0]["step"]))' "$1"; }

declare -A times
for ((i = 0; i < repeats; ++i)); do
  for config in none schedule set_lr; do
    "$engine" train "$out/$config.yaml" > /dev/null
    times[$config]+="$(step_ms "$out/runs/$config/metrics.jsonl") "
  done
done

python3 - "$repeats" "${times[none]}" "${times[schedule]}" "${times[set_lr]}" <<'PY'
import statistics, sys
repeats = sys.argv[1]
runs = {name: [float(t) for t in arg.split()] for name, arg in zip(["none", "schedule", "set_lr"], sys.argv[2:])}
best = {name: min(t) for name, t in runs.items()}
median = {name: statistics.median(t) for name, t in runs.items()}
print(f"quick start, {repeats} runs each   ms/step (fastest)  overhead   ms/step (median)  overhead")
for name in runs:
    print(f"{name:<30} {best[name]:>16.3f} {100 * (best[name] / best['none'] - 1):>8.2f}%"
          f" {median[name]:>18.3f} {100 * (median[name] / median['none'] - 1):>8.2f}%")
PY
