#!/usr/bin/env bash
# The GPU step against PyTorch on the same card, in one run: GPT-2 124M (bench/gpt2-124m-gpu.yaml:
# bf16, batch 32 x 1024, AdamW) or a Llama of 1.1B (bench/llama-1b-gpu.yaml: bf16, batch 8 x 2048,
# GQA, SwiGLU, RoPE, AdamW) trained by this engine, by PyTorch eager (bf16 autocast, SDPA, fused
# AdamW) and by torch.compile of the same model. Prints tokens/s, MFU (model FLOPs per token:
# 6 N + 6 L T C, N the parameters as llm.c counts GPT-2's (all of them) and torchtitan a Llama's
# (all but the input embedding), over the card's dense bf16 peak, 989 TFLOP/s
# for an H100/H200 SXM, and over its measured cuBLASLt rate) and peak memory (the engine's with its
# plan), then the engine's ten most expensive ops (telemetry.op_table, timed with CUDA events).
#
#   bench/gpu_step.sh [STEPS] [gpt2 | llama]   (default 12 gpt2; the first 3 steps of each run are not timed)
#   ENGINE   the engine's command (default build/engine; e.g. "bash .device/run.sh engine")
#   PYTHON   the Python with PyTorch and CUDA (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
read -r -a engine <<< "${ENGINE:-build/engine}"
python=${PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=${2:-gpt2}
case $model in
  gpt2)
    recipe=bench/gpt2-124m-gpu.yaml title="GPT-2 124M" arch=gpt
    vocab=50304 context=1024 layers=12 heads=12 width=768 batch=32 torch_extra=()
    # Every parameter, as llm.c counts GPT-2's 124M.
    counted_params=$((vocab * width + context * width + layers * (12 * width * width + 13 * width) + 2 * width))
    ;;
  llama)
    recipe=bench/llama-1b-gpu.yaml title="Llama 1.1B (GQA 32/4, SwiGLU 5632, RoPE)" arch=llama
    vocab=32000 context=2048 layers=22 heads=32 width=2048 batch=8 kv_heads=4 ffn=5632
    torch_extra=("$kv_heads" "$ffn")
    kv=$((kv_heads * width / heads))
    # Every parameter but the input embedding, a lookup (as torchtitan counts a Llama's).
    counted_params=$((vocab * width + layers * (width * (width + 2 * kv) + width * width + 3 * width * ffn + 2 * width) + width))
    ;;
  *) echo "gpu_step.sh: the model is gpt2 or llama, not $model" >&2; exit 2 ;;
esac
name=$(sed -n 's/^  name: //p' "$recipe" | head -1)
flops_per_token=$((6 * counted_params + 6 * layers * context * width))

median_rate() {  # metrics.jsonl: the median tokens/s of the timed steps
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rates = [r["tokens_per_second"] for r in rows if "tokens_per_second" in r and r["step"] > 3]
print(f"{statistics.median(rates):.1f}")
PY
}
# Timed without the op table (its events cost the step a little), then without the GPU plan's
# fusions (run.fusions=false: what they gain), then with cuDNN's unordered attention backward
# (run.deterministic=false: what the bit-for-bit promise costs), then once more with the op table.
# A run or a peer that fails shows its log's end and a rate of 0, so the rows that ran still print
# (where the engine's first run fails, its variants are not run, the peers are, and the script
# exits 1 at the end). Each rate is also said on stderr as it is measured, for a run cut short.
engine_run() {  # label directory overrides... -> the run's median tokens/s (0: it failed)
  local label=$1 dir=$2
  shift 2
  local rate=0
  if "${engine[@]}" train "$recipe" "train.steps=$steps" run.output_dir="$dir" "$@" > "$out/engine-$label.log" 2>&1; then
    rate=$(median_rate "$dir/$name/metrics.jsonl" || echo 0)  # no timed step (STEPS <= 3), or no metrics
    rm -f "$dir/$name/model.safetensors"  # the exported weights (4.4 GB for the Llama): not needed here
  else
    tail -20 "$out/engine-$label.log" >&2
  fi
  echo "gpu_step.sh: engine ($label): $rate tokens/s" >&2
  echo "$rate"
}
peak_of() { grep -so 'device memory peak [0-9.]* [KMGT]*B' "$out/engine-$1.log" | head -1 | sed 's/device memory peak //' || true; }
engine_rate=$(engine_run main "$out/main")
status=0 unfused_rate=0 unordered_rate=0
if [ "$engine_rate" = 0 ]; then
  echo "gpu_step.sh: the engine's run failed; its variants are not run, PyTorch's are" >&2
  status=1
else
  unfused_rate=$(engine_run unfused "$out/unfused" run.fusions=false)
  unordered_rate=$(engine_run unordered "$out/unordered" run.deterministic=false)
  engine_run op-table "$out/op-table" telemetry.op_table=true > /dev/null
fi
engine_peak=$(peak_of main) unfused_peak=$(peak_of unfused) unordered_peak=$(peak_of unordered)
run_torch() {
  (cd bench && "$python" pytorch_lm_cuda.py $arch $vocab $context $layers $heads $width $batch "$steps" "$1" \
    ${torch_extra[@]+"${torch_extra[@]}"}) \
    2> "$out/torch_$1.log" || { tail -20 "$out/torch_$1.log" >&2; printf 'tokens_per_second=0\npeak_memory_bytes=0\n'; }
}
value() { sed -n "s/^$1=//p" <<< "$2"; }
eager=$(run_torch eager)
echo "gpu_step.sh: pytorch eager: $(value tokens_per_second "$eager") tokens/s" >&2
compiled=$(run_torch compile)
echo "gpu_step.sh: torch.compile: $(value tokens_per_second "$compiled") tokens/s" >&2
# The card's measured bf16 matmul rate, as the engine's run printed it ("MFU against N GFLOP/s").
measured=$(grep -o 'MFU against [0-9.]* GFLOP/s' "$out/engine-main.log" | head -1 | grep -o '[0-9.]*' | head -1 || true)
row() {  # name tokens/s peak
  python3 -c "import sys; r=float(sys.argv[2]); m=float('${measured:-0}')*1e9 or float('nan'); f=r*$flops_per_token; print(f'| {sys.argv[1]:<22} | {r/1e3:9.1f}K | {100*f/989e12:5.1f}% | {100*f/m:11.1f}% | {sys.argv[3]:>12} |')" "$@"
}
echo "$title, bf16, batch $batch x $context, AdamW, $steps steps (3 untimed); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
echo "MFU: model FLOPs against the datasheet's dense bf16 peak (989 TFLOP/s), and against the card's measured cuBLASLt bf16 rate (${measured:-?} GFLOP/s)"
echo "| run                    |  tokens/s  |  MFU  | MFU measured | peak memory  |"
echo "|------------------------|------------|-------|--------------|--------------|"
row engine "$engine_rate" "${engine_peak:-?}"
row "engine, fusions off" "$unfused_rate" "${unfused_peak:-?}"
row "engine, unordered attn" "$unordered_rate" "${unordered_peak:-?}"
gib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.1f} GB')" "$1"; }  # the engine's units
row "pytorch eager" "$(value tokens_per_second "$eager")" "$(gib "$(value peak_memory_bytes "$eager")")"
row "pytorch torch.compile" "$(value tokens_per_second "$compiled")" "$(gib "$(value peak_memory_bytes "$compiled")")"
echo "(peak memory in GB of 2^30 bytes; a rate of 0: that run failed, its log's end is above)"
echo
echo "engine: the ten most expensive ops"
[ -f "$out/engine-op-table.log" ] && sed -n '/^op table/,/^$/p' "$out/engine-op-table.log" | sed -n 1,12p  # title, header, ten ops
grep -E '^(host time per step|device memory peak)' "$out/engine-main.log" || true
exit "$status"
