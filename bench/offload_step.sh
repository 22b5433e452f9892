#!/usr/bin/env bash
# What offload costs a training step: the benchmark GPT (bench/gpt-bench.yaml) without offload, with
# the optimizer state in an NVMe swap file, and at ZeRO stage 3 with the parameter shard there too,
# in fp32 and bf16, at the benchmark's batch (8) and at batch 1, where the optimizer step is most of
# the step. For each swap-file row: the swap bytes per step a run measures (metrics.jsonl) against
# the plan's exact figure (build/bench/offload_plan), the time the step waited for swap I/O, the
# time the same bytes take alone on this disk (build/bench/swap_io_bench: a sequential write and read
# through the same SwapFile, block size and queue depth, in the same directory, right after the run),
# and the share of that transfer the overlap with the update hid: 1 - wait / alone (at least 0).
#
#   bench/offload_step.sh [--dir DIR] [--steps N]
#     --dir    where the swap files go: the disk under test (default: a fresh directory under the
#              build directory, on the repository's disk; removed afterwards)
#     --steps  steps of each run (default 5; the first is not timed)
#   BUILD overrides the build directory (default build/), THREADS the OpenMP threads (default 2).
#
# The page cache is dropped before every run when this user may (root). Step time is the median of
# the timed steps' elapsed-time differences. Prints one markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '/^#   bench/,/^#   BUILD/s/^# \{0,1\}//p' "$0"; }
dir="" steps=5
source bench/dir_and_steps.sh
parse_dir_and_steps offload_step.sh 3 "$@"
build=${BUILD:-build}
threads=${THREADS:-2}
for tool in engine bench/offload_plan bench/swap_io_bench; do
  [[ -x $build/$tool ]] || { echo "offload_step.sh: $build/$tool not found; build the engine, offload_plan and swap_io_bench targets" >&2; exit 2; }
done
if [[ -n $dir ]]; then
  [[ -d $dir ]] || { echo "offload_step.sh: $dir is not a directory" >&2; exit 2; }
  work=$(mktemp -d "$dir/offload-step.XXXXXX")
else
  work=$(mktemp -d "$build/offload-step.XXXXXX")
fi
trap 'rm -rf "$work"' EXIT
recipe=bench/gpt-bench.yaml

cache="warm (not root: page cache kept)"
drop_caches() { sync; if echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then cache="dropped before every run"; fi; }

# The swap bandwidth of this directory for a transfer of BYTES (rounded up to 16 MiB): "write read" MB/s.
disk_mbps() {
  local bytes=$(( ($1 + 16777215) / 16777216 * 16777216 ))
  "$build/bench/swap_io_bench" --dir "$work" --bytes "$bytes" --request 16777216 |
    sed -n 's/.*write_MBps=\([0-9.]*\) read_MBps=\([0-9.]*\).*/\1 \2/p'
}

echo "| batch | precision | offload | tokens/s | step s | peak RSS MiB | swap read MB/step (plan, diff) | swap written MB/step (plan, diff) | swap wait s/step | transfer alone s | hidden by overlap |"
echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for batch in 8 1; do
  for precision in fp32 bf16; do
    for offload in none optimizer parameters; do
      case $offload in
        none) extra=() label="none" ;;
        optimizer) extra=(offload.optimizer=nvme) label="optimizer nvme" ;;
        parameters) extra=(distributed.zero_stage=3 offload.optimizer=nvme offload.parameters=nvme)
          label="stage 3, optimizer + parameters nvme" ;;
      esac
      overrides=(train.micro_batch_size="$batch" precision.mode="$precision" train.steps="$steps" train.log_every=1
        offload.nvme_path="$work" run.output_dir="$work" run.name=run "${extra[@]}")
      plan=$("$build/bench/offload_plan" "$recipe" "${overrides[@]}")
      drop_caches
      OMP_NUM_THREADS=$threads "$build/engine" train "$recipe" "${overrides[@]}" > "$work/train.log" 2>&1 ||
        { cat "$work/train.log" >&2; exit 1; }
      disk="0 0"
      [[ $offload == none ]] || disk=$(disk_mbps "$(sed -n 's/.*swap_read=\([0-9]*\) swap_written=\([0-9]*\).*/\1 \2/p' <<< "$plan" |
        awk '{ print ($1 > $2) ? $1 : $2 }')")
      python3 - "$work/run" "$batch" "$precision" "$label" "$plan" "$disk" << 'PY'
import json, statistics, sys
run, batch, precision, label, plan, disk = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
timed = rows[1:]
step_s = statistics.median(b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:]))
tokens = int(batch) * 256
peak = json.load(open(f"{run}/summary.json"))["peak_rss_bytes"] / 2**20
cells = [batch, precision, label, f"{tokens / step_s:.0f}", f"{step_s:.2f}", f"{peak:.0f}"]
if "swap_read_per_step" not in rows[0]:
    cells += ["-"] * 5
else:
    p = dict(kv.split("=") for kv in plan.split()[1:])
    read = statistics.median(r["swap_read_per_step"] for r in timed)
    written = statistics.median(r["swap_written_per_step"] for r in timed)
    wait = statistics.median(r["swap_wait_s_per_step"] for r in timed)
    write_mbps, read_mbps = map(float, disk.split())
    alone = read / (read_mbps * 1e6) + written / (write_mbps * 1e6)
    diff = lambda m, q: f"{m / 1e6:.1f} ({int(q) / 1e6:.1f}, {100 * (m - int(q)) / int(q):+.1f}%)"
    cells += [diff(read, p["swap_read"]), diff(written, p["swap_written"]), f"{wait:.3f}",
              f"{alone:.3f} ({write_mbps:.0f} W / {read_mbps:.0f} R MB/s)", f"{100 * max(0.0, 1 - wait / alone):.0f}%"]
print("| " + " | ".join(cells) + " |")
PY
      rm -rf "$work/run"
    done
  done
done
echo
echo "GPT 6 layers, d_model 384, context 256, vocab 50257 (bench/gpt-bench.yaml), AdamW, $threads threads, $steps steps per run" \
  "(median of steps 2-$steps); swap files in $work ($(df --output=source,fstype "$work" | tail -1 | tr -s ' ')), queue depth 8, 1 MiB" \
  "requests; page cache: $cache. Transfer alone: the plan's bytes at swap_io_bench's write and read bandwidth for" \
  "a file of that size in the same directory, measured right after each run."
