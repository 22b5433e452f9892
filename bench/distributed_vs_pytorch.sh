#!/usr/bin/env bash
# Data parallelism and ZeRO on this machine's CPU: trains the small GPT of
# bench/gpt-distributed.yaml (4 layers, d_model 128, 4 heads, context 64, vocabulary 2048,
# micro-batch 4 per rank, AdamW, fp32) on W ranks at ZeRO stages 0-3 with this engine
# (mpirun) and with PyTorch (gloo over TCP, bench/pytorch_distributed.py) in one run, and prints
# one markdown table: step time, tokens/s of all ranks, rank 0's peak resident memory, and the
# bytes rank 0 sent per step next to the theory. Every rank gets max(1, 2 / W) threads, so the
# ranks share the machine's 2 cores as one process would use them.
#
# PyTorch's rows per stage: 0 DistributedDataParallel, 1 DDP + ZeroRedundancyOptimizer,
# 2 FullyShardedDataParallel SHARD_GRAD_OP, 3 FSDP FULL_SHARD; a stage this PyTorch cannot run
# on CPU prints why. An engine without distributed training prints its refusal in its rows.
#
#   bench/distributed_vs_pytorch.sh [--steps N] [--worlds 1,2,4]
#     --steps   training steps per run (default 10; the first 2, or all but the last when fewer
#               than 3, are not timed; the table shows the median of the timed steps)
#     --worlds  comma-separated world sizes (default 1,2,4)
#   ENGINE, PYTHON, MPIRUN override build/engine, /usr/bin/python3 and mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '/^#   bench/,/^#   ENGINE/s/^# \{0,1\}//p' "$0"; }
steps=10
worlds=1,2,4
while (($#)); do
  case $1 in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --worlds) worlds=${2:?--worlds needs a list such as 1,2,4}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "distributed_vs_pytorch.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "--steps must be a positive integer, not '$steps'" >&2; exit 2; }
[[ $worlds =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "--worlds must look like 1,2,4, not '$worlds'" >&2; exit 2; }
IFS=, read -r -a world_list <<< "$worlds"
warmup=$((steps > 2 ? 2 : steps - 1))

engine=${ENGINE:-build/engine}
python=${PYTHON:-/usr/bin/python3}
mpirun=${MPIRUN:-mpirun}
recipe=bench/gpt-distributed.yaml
# The shape both sides train; given to the engine as overrides too, so the two cannot drift apart.
vocab=2048 context=64 layers=4 heads=4 width=128 batch=4
shape=("model.vocab_size=$vocab" "model.context_length=$context" "model.n_layer=$layers" "model.n_head=$heads"
       "model.n_embd=$width" "train.micro_batch_size=$batch")
torch_shape=(--vocab "$vocab" --context "$context" --layers "$layers" --heads "$heads" --width "$width"
             --batch "$batch")
limit=$((120 + 30 * steps))  # seconds one run may take before it counts as hung
# OpenBLAS misdetects new CPUs; the newest core whose instructions this CPU has (tests/parity).
coretype=${OPENBLAS_CORETYPE:-$("$python" tests/parity/openblas_coretype.py)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=$out/rows.jsonl

engine_row() {  # world, stage: appends one JSON row
  local world=$1 stage=$2 run=$out/engine-$1-$2 rc=0
  local threads=$((2 / world > 1 ? 2 / world : 1))
  if [[ ! -x $engine ]]; then
    printf '{"impl":"engine","world":%d,"stage":%d,"unavailable":"%s not found; build the engine first"}\n' \
      "$world" "$stage" "$engine" >> "$rows"
    return
  fi
  if ! command -v "$mpirun" > /dev/null; then
    printf '{"impl":"engine","world":%d,"stage":%d,"unavailable":"%s not found"}\n' \
      "$world" "$stage" "$mpirun" >> "$rows"
    return
  fi
  timeout "$limit" "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -n "$world" \
    -x OMP_NUM_THREADS="$threads" \
    "$engine" train "$recipe" "${shape[@]}" run.output_dir="$run" train.steps="$steps" train.log_every=1 \
    distributed.zero_stage="$stage" > "$run.log" 2>&1 || rc=$?
  "$python" - "$run/gpt-distributed" "$run.log" "$rc" "$world" "$stage" "$warmup" "$batch" "$context" "$limit" \
    >> "$rows" <<'PY'
import json, os, re, statistics, sys
run, log = sys.argv[1:3]
rc, world, stage, warmup, batch, context = (int(a) for a in sys.argv[3:9])
limit = sys.argv[9]
row = {"impl": "engine", "world": world, "stage": stage}
if rc != 0:
    lines = [l.strip() for l in open(log, errors="replace")]
    # The engine's own message ("error: ..."), not mpirun's banner about the exit status.
    errors = [l for l in lines if l.startswith("error:")]
    # Its first clause: what follows the semicolon is advice for running by hand.
    reason = re.sub(r"^(error:\s*)+", "", errors[0]).split("; ")[0] if errors else next(
        (l for l in reversed(lines) if l and not l.startswith("---")), "no output")
    if rc in (124, 137):
        reason = f"did not finish in {limit} s; last output: {reason}"
    row["unavailable"] = f"exit {rc}: {reason}"
else:
    try:
        summary = json.load(open(os.path.join(run, "summary.json")))
        metrics = map(json.loads, open(os.path.join(run, "metrics.jsonl")))
        elapsed = {r["step"]: r["elapsed_s"] for r in metrics if "elapsed_s" in r}
        elapsed[0] = 0.0
        step_s = statistics.median(elapsed[k] - elapsed[k - 1] for k in range(warmup + 1, max(elapsed) + 1))
        row.update(step_ms=1e3 * step_s, tokens_per_second=world * batch * context / step_s,
                   peak_rss_bytes=summary.get("peak_rss_bytes"),
                   bytes_sent_per_step=summary.get("bytes_sent_per_step"),
                   planned_bytes_sent_per_step=summary.get("planned_bytes_sent_per_step"))
    except (OSError, ValueError, KeyError) as error:  # a run that ended without its results
        row["unavailable"] = f"exit 0, but its results in {run} do not read: {type(error).__name__}: {error}"
print(json.dumps(row))
PY
}

torch_row() {  # world, stage: appends one JSON row
  local world=$1 stage=$2 log=$out/torch-$1-$2.log rc=0 result
  result=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} timeout "$limit" "$python" bench/pytorch_distributed.py \
    --world "$world" --stage "$stage" --steps "$steps" --warmup "$warmup" "${torch_shape[@]}" 2> "$log") || rc=$?
  "$python" - "$rc" "$world" "$stage" "$log" "$limit" "$result" >> "$rows" <<'PY'
import json, sys
rc, world, stage = (int(a) for a in sys.argv[1:4])
log, limit, result = sys.argv[4:7]
lines = [l for l in result.splitlines() if l.startswith("{")]
if rc == 0 and lines:
    row = json.loads(lines[-1])
else:
    tail = [l.strip() for l in open(log, errors="replace") if l.strip()]
    reason = f"did not finish in {limit} s" if rc in (124, 137) else f"exit {rc}: {tail[-1] if tail else 'no output'}"
    row = {"world": world, "stage": stage, "unavailable": reason}
row["impl"] = "torch"
print(json.dumps(row))
PY
}

params=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} "$python" bench/pytorch_distributed.py --count-params \
  "${torch_shape[@]}")
load=$(cut -d' ' -f1-3 /proc/loadavg)
for world in "${world_list[@]}"; do
  for stage in 0 1 2 3; do
    echo "world $world, ZeRO stage $stage ..." >&2
    engine_row "$world" "$stage"
    torch_row "$world" "$stage"
  done
done

torch_version=$("$python" -c 'import torch; print(torch.__version__)')
"$python" - "$rows" "$torch_version" "$load" "$params" "$steps" "$warmup" "$vocab" "$context" "$layers" "$heads" \
  "$width" "$batch" <<'PY'
import json, sys
rows_file, torch_version, load = sys.argv[1:4]
params, steps, warmup, vocab, context, layers, heads, width, batch = (int(a) for a in sys.argv[4:13])
rows = [json.loads(line) for line in open(rows_file)]
MiB = 2**20


def theory(world, stage):
    """Bytes one rank sends per step with ring collectives: (W-1)/W of 2Ψ (stages 0-2: gradients
    reduce-scattered, parameters or updates all-gathered) or 3Ψ (stage 3: + parameters gathered
    again for the backward pass) fp32 elements."""
    return (world - 1) / world * (3 if stage == 3 else 2) * params * 4


def cell(value, scale=1.0, digits=1):
    return "-" if value is None else f"{value / scale:,.{digits}f}"


print(f"\nGPT {layers} layers, d_model {width}, {heads} heads, context {context}, vocab {vocab}:", end=" ")
print(f"Ψ = {params:,} parameters;")
print(f"micro-batch {batch} per rank, AdamW, fp32, gradient clipping 1.0; threads per rank = max(1, 2 / W);")
print(f"{steps} steps, the first {warmup} not timed; PyTorch {torch_version} with gloo; load average at start {load}\n")
header = ["W", "ZeRO", "implementation", "step ms", "tokens/s", "peak RSS MiB", "sent MiB/step", "theory MiB/step",
          "sent / theory", "engine plan MiB"]
print("| " + " | ".join(header) + " |")
print("|" + "|".join("---:" if i != 2 else "---" for i in range(len(header))) + "|")
for r in rows:
    w, s = r["world"], r["stage"]
    t = theory(w, s)
    name = "engine" if r["impl"] == "engine" else f"PyTorch {r.get('name', '')}".strip()
    if "unavailable" in r:
        cells = [f"n/a ({r['unavailable']})", "", "", "", cell(t, MiB, 2), "", ""]
    else:
        sent = r.get("bytes_sent_per_step")
        ratio = "-" if sent is None or t == 0 else f"{sent / t:.2f}"
        cells = [cell(r["step_ms"]), cell(r["tokens_per_second"], digits=0), cell(r["peak_rss_bytes"], MiB, 0),
                 cell(sent, MiB, 2), cell(t, MiB, 2), ratio, cell(r.get("planned_bytes_sent_per_step"), MiB, 2)]
    print(f"| {w} | {s} | {name} | " + " | ".join(cells) + " |")
print("""
step ms is the median of the timed steps (this machine's load comes and goes); tokens/s counts the tokens of all W
ranks at that step time; peak RSS (VmHWM) and bytes sent are rank 0's. Theory: what one rank sends per step with ring
collectives, (W-1)/W x 2Ψ x 4 bytes at stages 0-2 (a reduce-scatter and an all-gather of Ψ fp32 values, or one
all-reduce) and (W-1)/W x 3Ψ x 4 bytes at stage 3 (parameters gathered for the forward and again for the backward
pass, gradients reduce-scattered). PyTorch's bytes are the TCP payload its sockets sent (TCP_INFO); the
engine's are its own count (summary.json bytes_sent_per_step; its plan, planned_bytes_sent_per_step, beside it).
A load average above the 2 cores slows the ranks that run 2 threads (W = 1) the most.""")
PY
