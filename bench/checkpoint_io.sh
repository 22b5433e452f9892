#!/usr/bin/env bash
# Checkpoint I/O on this machine: how fast the engine writes and reads a checkpoint of the
# benchmark GPT (bench/gpt-bench.yaml: 6 layers, d_model 384, GPT-2 vocabulary, AdamW: fp32 masters
# + two moments, about 0.37 GB), next to the disk's sequential bandwidth (dd, fsync'd) and to
# PyTorch's torch.save / torch.load of the same bytes (+ fsync) in the same directory, and what
# checkpointing every other step costs a training step, asynchronous and synchronous.
#
#   bench/checkpoint_io.sh [--dir DIR] [--steps N]
#     --dir    where to write (default: a temporary directory under runs/; the disk under test)
#     --steps  training steps of each step-time run (default 12; the first 2 are not timed)
#   ENGINE and PYTHON override build/engine and /usr/bin/python3 (with torch, e.g. Debian's
#   python3-torch).
#
# Reads are measured cold when this user may drop the page cache (root), else warm (said in the
# table). Prints one markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '/^#   bench/,/^#   python3-torch/s/^# \{0,1\}//p' "$0"; }
dir="" steps=12
source bench/dir_and_steps.sh
parse_dir_and_steps checkpoint_io.sh 4 "$@"
engine=${ENGINE:-build/engine}
python=${PYTHON:-/usr/bin/python3}
[[ -x $engine ]] || { echo "checkpoint_io.sh: $engine not found; build the engine first" >&2; exit 2; }
mkdir -p runs
work=$(mktemp -d "${dir:-runs}/checkpoint-io.XXXXXX")
trap 'rm -rf "$work"' EXIT
recipe=bench/gpt-bench.yaml

cold=warm
drop_caches() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then cold=cold; fi; }

# The disk: 1 GiB written and fsync'd, then read back.
dd_write=$(dd if=/dev/zero of="$work/dd.bin" bs=16M count=64 conv=fsync 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
drop_caches
dd_read=$(dd if="$work/dd.bin" of=/dev/null bs=16M 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
rm -f "$work/dd.bin"

# The engine: one synchronous checkpoint after 2 steps (its write and fsync time from
# metrics.jsonl), then a resume that reads it back.
"$engine" train "$recipe" train.steps=2 checkpoint.at_end=true checkpoint.async=false \
  run.output_dir="$work" run.name=io > "$work/write.log"
drop_caches
"$engine" train "$recipe" train.steps=3 --resume run.output_dir="$work" run.name=io > "$work/read.log"
bytes=$(du -b "$work/io/checkpoints/step-2/rank-00000.bin" | cut -f1)

# Step time while checkpointing every other step (async, sync) and without checkpoints.
for mode in none async sync; do
  case $mode in
    none) extra=() ;;
    async) extra=(checkpoint.every_steps=2 checkpoint.async=true checkpoint.keep_last=1) ;;
    sync) extra=(checkpoint.every_steps=2 checkpoint.async=false checkpoint.keep_last=1) ;;
  esac
  "$engine" train "$recipe" train.steps="$steps" train.log_every=1 "${extra[@]}" \
    run.output_dir="$work" run.name="steps-$mode" > "$work/steps-$mode.log"
done

"$python" - "$work" "$bytes" "$dd_write" "$dd_read" "$cold" <<'EOF'
import json, os, statistics, sys, time
work, size, dd_write, dd_read, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

def events(run, kind):
    with open(os.path.join(work, run, "metrics.jsonl")) as f:
        return [j for j in map(json.loads, f) if j.get("event") == kind]

def gbps(text):  # dd's "1.2 GB/s" / "850 MB/s"
    value, unit = text.split()
    return float(value) * {"GB/s": 1, "MB/s": 1e-3, "kB/s": 1e-6, "GiB/s": 1.073741824, "MiB/s": 1.048576e-3}[unit]

write = events("io", "checkpoint")[-1]
read = events("io", "resume")[-1]
rows = [("disk: dd 1 GiB, fsync'd", gbps(dd_write), gbps(dd_read)),
        ("engine checkpoint (%.0f MB, rank file + fsync; manifest)" % (write["bytes"] / 1e6),
         write["bytes"] / write["write_s"] / 1e9, read["bytes"] / read["read_s"] / 1e9)]

try:
    import torch
    # The same bytes as three fp32 tensors, like masters + exp_avg + exp_avg_sq, saved as one file.
    third = size // 12
    state = {k: torch.rand(third) for k in ("master", "exp_avg", "exp_avg_sq")}
    path = os.path.join(work, "torch.pt")
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    saved = time.perf_counter() - start
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null")
    start = time.perf_counter()
    torch.load(path)
    loaded = time.perf_counter() - start
    rows.append(("PyTorch %s torch.save + fsync / torch.load" % torch.__version__, size / saved / 1e9,
                 size / loaded / 1e9))
except ImportError as e:
    rows.append(("PyTorch: not installed (%s)" % e, float("nan"), float("nan")))

def step_times(run):
    with open(os.path.join(work, run, "metrics.jsonl")) as f:
        lines = [j for j in map(json.loads, f) if "elapsed_s" in j]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(lines, lines[1:])]
    return times[2:]

print("| what | write GB/s | read GB/s (%s cache) |" % cold)
print("|---|---:|---:|")
for name, w, r in rows:
    print("| %s | %.2f | %.2f |" % (name, w, r))
base = statistics.mean(step_times("steps-none"))
print()
print("| checkpoint every 2 steps | mean step time (s) | cost per step |")
print("|---|---:|---:|")
for mode in ("none", "async", "sync"):
    t = statistics.mean(step_times("steps-" + mode))
    print("| %s | %.3f | %+.1f%% |" % (mode, t, 100 * (t - base) / base))
EOF
