#!/usr/bin/env bash
# How large a model one GPU trains with each memory setting, and how fast, against PyTorch FSDP2
# with CPUOffloadPolicy on the same card in the same run. The model is bench/gpt-offload-gpu.yaml
# (GPT, d_model 2048, context 1024, bf16, full activation checkpointing, AdamW) at varying depth.
#
#   1. The largest depth each setting fits, by `engine plan` against this machine: the GPU's free
#      memory, MemAvailable (the host plan with its checkpoint snapshot, as `engine train` checks
#      it) and the swap directory's free space. The plans are exact (CudaZero.Staged...Within-
#      FivePercent, CudaTraining.MeasuredDeviceMemory... and the host plan's tests).
#   2. Tokens/s of each setting at one depth (default 16 layers, 0.91B parameters), trained for
#      STEPS steps (the first untimed), next to FSDP2 + CPUOffloadPolicy on the same model.
#
#   bench/gpu_offload.sh [LAYERS] [STEPS]   (defaults 16 and 3)
#   ENGINE   the engine's command (default build/engine; e.g. "bash .device/run.sh engine")
#   PYTHON   the Python with PyTorch and CUDA (default python3)
#   SWAP     the directory of the NVMe setting's swap files (default: a new one under /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-16}
steps=${2:-3}
read -r -a engine <<< "${ENGINE:-build/engine}"
python=${PYTHON:-python3}
out=$(mktemp -d)
swap=${SWAP:-$out/swap}
mkdir -p "$swap"
trap 'rm -rf "$out"' EXIT
recipe=bench/gpt-offload-gpu.yaml
vocab=50304 context=1024 heads=16 width=2048 batch=8
names=("stage 0 (resident)" "ZeRO-Offload (cpu)" "ZeRO-Infinity (nvme)")
settings=("distributed.zero_stage=0"
  "distributed.zero_stage=2 offload.optimizer=cpu"
  "distributed.zero_stage=3 offload.optimizer=nvme offload.parameters=nvme offload.nvme_path=$swap")
# In the shell's 64-bit arithmetic: some awks print integers through a 32-bit int.
host_budget=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
nvme_budget=$(df -B1 --output=avail "$swap" | tail -1 | tr -d ' ')

device_budget=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1 || echo 0)
# Less what the plan does not count: the CUDA context and cuDNN's attention workspace.
device_headroom=$(( 2 << 30 ))
device_budget=$(( (${device_budget:-0} << 20) - device_headroom ))

plan_numbers() {  # layers setting -> "parameters host_needed device swap" in bytes, from `engine plan`
  # shellcheck disable=SC2086
  "${engine[@]}" plan $recipe model.n_layer="$1" $2 2> /dev/null | python3 -c '
import re, sys
text = sys.stdin.read()
def total(after):
    section = text[text.index(after):]
    return int(re.search(r"^  total\s+(\d+)", section, re.M).group(1))
snapshot = int(re.search(r"^  checkpoint snapshot\s+(\d+)", text, re.M).group(1))
swap = re.search(r"swap files ([0-9.]+) ([KMGT]?B) per rank", text)
scale = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}  # engine plan prints binary units
swap_bytes = int(float(swap.group(1)) * scale[swap.group(2)]) if swap else 0
print(total("parameters by wrap unit"), total("memory per rank") + snapshot, total("device memory per rank"), swap_bytes)'
}
fits() {  # layers setting -> exit 0 when the plan fits the GPU, host memory and swap space
  local numbers
  numbers=$(plan_numbers "$1" "$2") || return 1
  read -r _ host device swap <<< "$numbers"
  [ "$host" -le "$host_budget" ] && [ "$device" -le "$device_budget" ] && [ "$swap" -le "$nvme_budget" ]
}
gb() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e9:.1f} GB')" "$1"; }
largest() {  # setting -> the most layers that fit: the plan is linear in the depth (two plans give
  # each budget's slope and intercept), confirmed by planning the answer (and one less until it fits)
  local a b depth
  a=$(plan_numbers 4 "$1") b=$(plan_numbers 8 "$1")
  depth=$(python3 - "$host_budget" "$device_budget" "$nvme_budget" $a $b <<'PY'
import sys
budgets = [int(x) for x in sys.argv[1:4]]
a = [int(x) for x in sys.argv[5:8]]
b = [int(x) for x in sys.argv[9:12]]
depth = 4096
for budget, x4, x8 in zip(budgets, a, b):
    slope = (x8 - x4) / 4
    if slope > 0:
        depth = min(depth, int((budget - (x4 - 4 * slope)) // slope))
print(max(depth, 0))
PY
)
  while [ "$depth" -gt 0 ] && ! fits "$depth" "$1"; do depth=$((depth - 1)); done
  echo "$depth"
}
say() { echo "[$(date +%T)] $*" >&2; }

echo "budgets: device $((device_budget >> 20)) MiB free (less $((device_headroom >> 20)) MiB for the context and cuDNN), host $((host_budget >> 30)) GiB available (MemAvailable)," \
  "swap $((nvme_budget >> 30)) GiB free in $swap"
largest_rows=()
for i in "${!names[@]}"; do
  say "largest for ${names[$i]}"
  depth=$(largest "${settings[$i]}")
  p=- d=- h=- s=-
  if [ "$depth" -gt 0 ]; then
    read -r params h d s <<< "$(plan_numbers "$depth" "${settings[$i]}")"
    p=$(python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e9:.2f}B')" "$params")
    h=$(gb "$h") d=$(gb "$d") s=$(gb "$s")
  fi
  largest_rows+=("$(printf '| %-22s | %6s | %9s | %12s | %12s | %12s |' "${names[$i]}" "$depth" "$p" "$d" "$h" "$s")")
  say "${largest_rows[-1]}"
done

rate() {  # metrics.jsonl -> median tokens/s of the steps after the first
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rates = [r["tokens_per_second"] for r in rows if "tokens_per_second" in r and r["step"] > 1]
print(f"{statistics.median(rates):.1f}" if rates else "0")
PY
}
measured_rows=()
row() { python3 -c "import sys; print(f'| {sys.argv[1]:<30} | {float(sys.argv[2]):9.1f} | {sys.argv[3]:>12} |')" "$@"; }
measure_engine() {  # index
  local i=$1 log="$out/engine_$1.log" r peak
  say "training ${names[$i]} at $layers layers"
  # shellcheck disable=SC2086
  if "${engine[@]}" train $recipe model.n_layer="$layers" ${settings[$i]} train.steps="$steps" \
    run.output_dir="$out/run_$i" > "$log" 2>&1; then
    r=$(rate "$out/run_$i/gpt-offload-gpu/metrics.jsonl")
    peak=$(grep -o 'device memory peak [0-9.]* [KMGT]*B' "$log" | head -1 | sed 's/device memory peak //' || true)
  else
    r=0 peak="failed"
    tail -5 "$log" >&2
  fi
  measured_rows+=("$(row "engine ${names[$i]}" "$r" "${peak:-?}")")
  say "${measured_rows[-1]}"
  grep -E '^(step |host time per step)' "$log" >&2 || true
}
measure_fsdp() {
  say "FSDP2 with CPUOffloadPolicy at $layers layers"
  local fsdp
  if fsdp=$(cd bench && "$python" pytorch_fsdp_offload.py $vocab $context "$layers" $heads $width $batch "$steps" \
    2> "$out/fsdp.log"); then
    measured_rows+=("$(row "pytorch FSDP2 CPUOffloadPolicy" "$(sed -n 's/^tokens_per_second=//p' <<< "$fsdp")" \
      "$(($(sed -n 's/^peak_memory_bytes=//p' <<< "$fsdp") >> 20)) MiB")")
  else
    measured_rows+=("| pytorch FSDP2 CPUOffloadPolicy | did not run: $(tail -1 "$out/fsdp.log" | cut -c1-80) |")
  fi
  cat "$out/fsdp.log" >&2
}
# The slowest (NVMe) last, so a run cut short still reports the others.
measure_engine 0
measure_engine 1
measure_fsdp
measure_engine 2

card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo
echo "The largest GPT (d_model 2048, context 1024, micro-batch 8, bf16, full checkpointing) by engine plan, on $card:"
echo "| setting                | layers | parameters | device plan  | host needed  | swap         |"
echo "|------------------------|--------|------------|--------------|--------------|--------------|"
printf '%s\n' "${largest_rows[@]}"
echo
echo "Measured at $layers layers, $steps steps (the first untimed), micro-batch 8 x $context:"
echo "| run                            |  tokens/s | device peak  |"
echo "|--------------------------------|-----------|--------------|"
printf '%s\n' "${measured_rows[@]}"
