#!/usr/bin/env bash
# The memory and speed levers on a 12-layer GPT (GPT-2 small's shape: d_model 768, 12 heads,
# context 256, GPT-2 vocabulary; batch 4): for each activation-checkpointing policy and for bf16,
# the activation arena `engine plan` computes, the peak resident memory and the step time of a
# real run, next to PyTorch on this machine in the same run (fp32, torch.utils.checkpoint per
# block, CPU autocast to bf16). 2 threads each.
#
#   bench/memory_levers.sh [STEPS]      (default 5; the first 2 steps of each run are not timed)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-5}
engine=${ENGINE:-build/engine}
python=${PYTHON:-/usr/bin/python3}
# OpenBLAS misdetects new CPUs; the newest core whose instructions this CPU has (tests/parity).
coretype=${OPENBLAS_CORETYPE:-$("$python" tests/parity/openblas_coretype.py)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
shape=(model.n_layer=12 model.n_embd=768 model.n_head=12 train.micro_batch_size=4 data.prefetch=1)

engine_row() {  # label, overrides...
  local label=$1
  shift
  local arena
  arena=$("$engine" plan bench/gpt-bench.yaml "${shape[@]}" "$@" | sed -n 's/^  activation peak *\([0-9]*\).*/\1/p')
  OMP_NUM_THREADS=2 "$engine" train bench/gpt-bench.yaml "${shape[@]}" "$@" run.output_dir="$out" \
    train.steps="$steps" > "$out/engine.log"
  "$python" - "$out/gpt-bench" "$label" "$arena" <<'PY'
import json, sys
run, label, arena = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
timed = [r for r in rows if r["step"] > 2]
tps = sum(r["tokens_per_second"] for r in timed) / len(timed)
summary = json.load(open(f"{run}/summary.json"))
print(f"| engine {label:<31} | {arena / 2**20:10.0f} | {summary['peak_rss_bytes'] / 2**20:10.0f} | {4 * 256 / tps:8.2f} |")
PY
}

torch_row() {  # label, mode
  local result
  result=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} OMP_NUM_THREADS=2 "$python" bench/pytorch_gpt.py 50257 256 12 12 768 4 "$steps" "$2" 2>/dev/null)
  local tps rss
  tps=$(sed -n 's/^tokens_per_second=//p' <<< "$result")
  rss=$(sed -n 's/^peak_rss_bytes=//p' <<< "$result")
  printf '| PyTorch %-30s | %10s | %10.0f | %8.2f |\n' "$1" "-" "$(echo "$rss / 1048576" | bc -l)" "$(echo "1024 / $tps" | bc -l)"
}

printf '\nGPT 12 layers, d_model 768, 12 heads, context 256, batch 4, vocab 50257, 2 threads, %s steps\n\n' "$steps"
printf '| %-38s | %10s | %10s | %8s |\n' "run" "arena MiB" "peak MiB" "s/step"
printf '|%s|%s|%s|%s|\n' "----------------------------------------" "------------" "------------" "----------"
engine_row "fp32, no checkpointing"
engine_row "fp32, selective" activation_checkpointing.policy=selective
engine_row "fp32, every_k (k=2)" activation_checkpointing.policy=every_k activation_checkpointing.k=2
engine_row "fp32, full" activation_checkpointing.policy=full
engine_row "fp32, full + cpu_checkpointing" activation_checkpointing.policy=full activation_checkpointing.cpu_checkpointing=true
engine_row "bf16, no checkpointing" precision.mode=bf16
engine_row "bf16, full" precision.mode=bf16 activation_checkpointing.policy=full
torch_row "fp32" fp32
torch_row "fp32, checkpoint per block" checkpoint
torch_row "bf16 autocast" bf16
