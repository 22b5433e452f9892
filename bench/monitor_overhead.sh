#!/usr/bin/env bash
# What hardware monitoring costs the step. Trains the benchmark GPT (bench/gpt-bench.yaml, 2
# threads) without a monitor and with one sampling every 0.05 s (100x the default 5 s), alternating
# the two ROUNDS times, and prints the median step time of each, their difference, and the
# monitor thread's own time per step (the CPU time it can take from the step at most).
#
#   bench/monitor_overhead.sh [ROUNDS] [STEPS]      (default 3 rounds of 8 steps; 2 untimed each)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-8}
engine=${ENGINE:-build/engine}
python=${PYTHON:-/usr/bin/python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # $1: interval, $2: run name
  OMP_NUM_THREADS=2 "$engine" train bench/gpt-bench.yaml run.output_dir="$out" run.name="$2" train.steps="$steps" \
    telemetry.monitor_interval="$1" telemetry.tensorboard=false > "$out/$2.log"
}
for round in $(seq "$rounds"); do
  run 0 "off-$round"
  run 0.05 "on-$round"
done

"$python" - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def step_times(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"step_time_s"' in l]
    return [r["step_time_s"] for r in rows if r["step"] > 2]
off = [t for k in range(1, rounds + 1) for t in step_times(f"off-{k}")]
on = [t for k in range(1, rounds + 1) for t in step_times(f"on-{k}")]
samples = seconds = steps = 0
for k in range(1, rounds + 1):
    s = json.load(open(f"{out}/on-{k}/summary.json"))
    samples += s["monitor_samples"]; seconds += s["monitor_seconds"]; steps += s["steps"]
m_off, m_on = statistics.median(off), statistics.median(on)
print(f"\nbenchmark GPT, 2 threads, {rounds} alternating rounds, {len(off)} timed steps each way\n")
print(f"| monitor            | median step s | vs off  |")
print(f"|--------------------|---------------|---------|")
print(f"| off                | {m_off:13.4f} |         |")
print(f"| every 0.05 s       | {m_on:13.4f} | {100 * (m_on / m_off - 1):+6.2f}% |")
print(f"\nthe monitor thread: {samples} samples, {1e3 * seconds / samples:.3f} ms each; "
      f"{1e3 * seconds / steps:.3f} ms per step = {100 * seconds / steps / m_on:.3f}% of a step at 0.05 s, "
      f"{100 * seconds / steps / m_on / 100:.4f}% at the default 5 s")
PY
