#!/usr/bin/env bash
# Tensor parallelism beside data parallelism on this machine's CPU: trains the GPT of
# bench/gpt-distributed.yaml (widened by --width) at one global batch (8 sequences, micro-batch 4)
# in the layouts of --ranks ranks, tensor-parallel T x data-parallel D, each rank with
# max(1, cores / ranks) threads, and prints one markdown table: step time, tokens/s of all ranks,
# each rank's peak resident memory (rank 0's and the largest), and the bytes a rank sent per step,
# measured and planned (the tensor-parallel group's share apart). One process (1 x 1) is the baseline.
#
#   bench/tensor_parallel.sh [--steps N] [--ranks R] [--width C]
#     --steps  training steps per run (default 8; the first 2 are not timed, the median of the rest is)
#     --ranks  ranks of the split layouts (default 2: 1 x 2 and 2 x 1; 4 adds 1 x 4, 2 x 2, 4 x 1)
#     --width  n_embd (default 256; heads 4, MLP 4 x width, vocabulary 2048)
#   ENGINE and MPIRUN override build/engine and mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '/^#   bench/,/^#   ENGINE/s/^# \{0,1\}//p' "$0"; }
steps=8 ranks=2 width=256
while (($#)); do
  case $1 in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --ranks) ranks=${2:?--ranks needs a number}; shift 2 ;;
    --width) width=${2:?--width needs a number}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "tensor_parallel.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[1-9][0-9]*$ && $steps -ge 3 ]] || { echo "--steps must be an integer of at least 3" >&2; exit 2; }
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "--ranks must be a positive integer" >&2; exit 2; }
[[ $width =~ ^[1-9][0-9]*$ ]] || { echo "--width must be a positive integer" >&2; exit 2; }
engine=${ENGINE:-build/engine}
mpirun=${MPIRUN:-mpirun}
cores=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "GPT (4 layers, n_embd $width, 4 heads, context 64, vocabulary 2048), global batch 8 x 64 tokens, fp32, AdamW;"
echo "$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo
echo "| layout (T x D) | ranks x threads | step (ms) | tokens/s | peak RSS rank 0 / largest | sent/rank/step (tensor) | planned (tensor) |"
echo "|---|---|---|---|---|---|---|"

row() {  # tensor data
  local t=$1 d=$2 world=$(($1 * $2)) run=$out/t$1d$2
  local threads=$((cores / world > 1 ? cores / world : 1))
  local launcher=()
  ((world > 1)) && launcher=("$mpirun" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np "$world")
  if ! OMP_NUM_THREADS=$threads timeout 600 "${launcher[@]}" "$engine" train bench/gpt-distributed.yaml \
      model.n_embd="$width" train.steps="$steps" train.global_batch_size=8 train.micro_batch_size=4 \
      ~train.gradient_accumulation_steps distributed.tensor_parallel="$t" run.output_dir="$out" run.name="t$1d$2" \
      > "$run.log" 2>&1; then
    echo "| $t x $d | $world x $threads | failed: $(grep -m1 -i error "$run.log" | cut -c1-80) | | | | |"
    return
  fi
  python3 - "$out/t$1d$2" "$t" "$d" "$world" "$threads" <<'EOF'
import json, statistics, sys
run, t, d, world, threads = sys.argv[1:]
lines = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
times = [l["step_time_s"] for l in lines[2:] if "step_time_s" in l] or [0]
rate = statistics.median([l["tokens_per_second"] for l in lines[2:]])
s = json.load(open(run + "/summary.json"))
mb = lambda b: f"{b / 2**20:.1f} MB"
peaks = s["peak_rss_bytes_per_rank"]
kb = lambda b: f"{b / 1024:.1f} KB"
print(f"| {t} x {d} | {world} x {threads} | {1000 * statistics.median(times):.1f} | {rate:,.0f} | "
      f"{mb(peaks[0])} / {mb(max(peaks))} | {kb(s['bytes_sent_per_step'])} ({kb(s['tensor_bytes_sent_per_step'])}) | "
      f"{kb(s['planned_bytes_sent_per_step'])} ({kb(s['planned_tensor_bytes_sent_per_step'])}) |")
EOF
}

row 1 1
for ((t = 1; t <= ranks; t *= 2)); do
  ((ranks % t == 0)) && row "$t" $((ranks / t))
done
echo
echo "step: the median step time after 2 warm-up steps (step_time_s in metrics.jsonl); sent: measured by the"
echo "communicators over the run's steps; planned: engine plan's count for the same layout."
