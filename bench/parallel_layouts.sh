#!/usr/bin/env bash
# Tensor and pipeline parallelism beside data parallelism on this machine's CPU: trains the GPT of
# bench/gpt-distributed.yaml (widened by --width) at one global batch (16 sequences, micro-batch 4)
# in the layouts of --ranks ranks: tensor-parallel T x pipeline stages P x data-parallel D, each
# rank with max(1, cores / ranks) threads, and prints one markdown table: step time, tokens/s of all
# ranks, each rank's peak resident memory (rank 0's and the largest), the bytes rank 0 sent per step
# (measured and planned, the tensor-parallel group's share apart) and, for pipelines, each stage's
# measured idle fraction beside the schedule's bubble. One process (1 x 1 x 1) is the baseline.
#
#   bench/parallel_layouts.sh [--steps N] [--ranks R] [--width C]
#     --steps  training steps per run (default 8; the first 2 are not timed, the median of the rest is)
#     --ranks  ranks of the split layouts (default 2: D = 2, T = 2 and P = 2; 4 adds more)
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
    *) echo "parallel_layouts.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
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

echo "GPT (4 layers, n_embd $width, 4 heads, context 64, vocabulary 2048), global batch 16 x 64 tokens, fp32, AdamW;"
echo "$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo
echo "| layout (T x P x D) | ranks x threads | step (ms) | tokens/s | peak RSS rank 0 / largest | rank 0 sent/step (tensor) | planned (tensor) | idle per stage (bubble) |"
echo "|---|---|---|---|---|---|---|---|"

row() {  # tensor pipeline data
  local t=$1 p=$2 d=$3 world=$(($1 * $2 * $3)) run=$out/t$1p$2d$3
  local threads=$((cores / world > 1 ? cores / world : 1))
  local launcher=()
  ((world > 1)) && launcher=("$mpirun" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np "$world")
  if ! OMP_NUM_THREADS=$threads timeout 600 "${launcher[@]}" "$engine" train bench/gpt-distributed.yaml \
      model.n_embd="$width" train.steps="$steps" train.global_batch_size=16 train.micro_batch_size=4 \
      ~train.gradient_accumulation_steps distributed.tensor_parallel="$t" distributed.pipeline_parallel="$p" \
      run.output_dir="$out" run.name="t$1p$2d$3" > "$run.log" 2>&1; then
    echo "| $t x $p x $d | $world x $threads | failed: $(grep -m1 -i error "$run.log" | cut -c1-80) | | | | | |"
    return
  fi
  python3 - "$out/t$1p$2d$3" "$t" "$p" "$d" "$world" "$threads" <<'EOF'
import json, statistics, sys
run, t, p, d, world, threads = sys.argv[1:]
lines = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
times = [l["step_time_s"] for l in lines[2:] if "step_time_s" in l] or [0]
rate = statistics.median([l["tokens_per_second"] for l in lines[2:]])
s = json.load(open(run + "/summary.json"))
mb = lambda b: f"{b / 2**20:.1f} MB"
peaks = s["peak_rss_bytes_per_rank"]
kb = lambda b: f"{b / 1024:.1f} KB"
idle = s.get("pipeline_idle_fraction_per_stage")
bubble = " / ".join(f"{100 * f:.0f}%" for f in idle) + f" ({100 * s['pipeline_bubble']:.0f}%)" if idle else ""
print(f"| {t} x {p} x {d} | {world} x {threads} | {1000 * statistics.median(times):.1f} | {rate:,.0f} | "
      f"{mb(peaks[0])} / {mb(max(peaks))} | {kb(s['bytes_sent_per_step'])} ({kb(s['tensor_bytes_sent_per_step'])}) | "
      f"{kb(s['planned_bytes_sent_per_step'])} ({kb(s['planned_tensor_bytes_sent_per_step'])}) | {bubble} |")
EOF
}

row 1 1 1
for ((t = 1; t <= ranks; t *= 2)); do
  for ((p = 1; t * p <= ranks; p *= 2)); do
    ((ranks % (t * p) == 0 && (t == 1 || p == 1))) && row "$t" "$p" $((ranks / (t * p)))
  done
done
echo
echo "step: the median step time after 2 warm-up steps (step_time_s in metrics.jsonl); sent: measured by the"
echo "communicators over the run's steps; planned: engine plan's count for the same layout; idle: the time each"
echo "pipeline stage waited for the others, beside the 1F1B bubble (P - 1) / (M + P - 1)."
