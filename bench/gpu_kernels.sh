#!/usr/bin/env bash
# The engine's most expensive GPU kernels in GPT-2 124M's step (bench/gpt2-124m-gpu.yaml: bf16,
# batch 32 x 1024, AdamW), from Nsight Compute: every kernel of a short run (eagerly launched, not
# in CUDA graphs, so each is its own launch) timed by the GPU with its DRAM bytes, grouped by
# kernel, per step; each with its achieved bandwidth against the card's (a device-to-device copy's)
# and its bound. Complements the op table of bench/gpu_step.sh, which times ops (a node may launch
# several kernels) with CUDA events. The run names the card's peak (telemetry.peak_flops), so the
# engine's matmul probe (13 products of 8192^3 before the first step) is not counted as the step's.
#
#   bench/gpu_kernels.sh [STEPS]   (default 2)
#   ENGINE  the engine's command (default build/engine);  NCU  Nsight Compute (default ncu)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2}
read -r -a engine <<< "${ENGINE:-build/engine}"
ncu=${NCU:-ncu}
command -v "$ncu" > /dev/null || { echo "gpu_kernels: no Nsight Compute ($ncu) here"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ncu" --clock-control none --cache-control none --replay-mode application --target-processes all --csv --log-file "$out/kernels.csv" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  "${engine[@]}" train bench/gpt2-124m-gpu.yaml "train.steps=$steps" run.cuda_graphs=false \
  run.output_dir="$out/run" telemetry.op_table=true telemetry.peak_flops=989e12 \
  > "$out/engine.log" 2>&1 || { tail -30 "$out/engine.log"; exit 1; }
bandwidth=$(grep -o 'roofline against [0-9.]* GFLOP/s, [0-9.]* GB/s' "$out/engine.log" | grep -o '[0-9.]* GB/s' | grep -o '[0-9.]*' || echo 0)
python3 - "$out/kernels.csv" "$steps" "$bandwidth" <<'PY'
import collections, csv, sys
path, steps, bandwidth = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) * 1e9
scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3,
         "s": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "B": 1.0, "KB": 1e3,
         "MB": 1e6, "GB": 1e9, "TB": 1e12}
units = set()
lines = [l for l in open(path) if l.startswith('"')]
kernels = {}
for row in csv.DictReader(lines):
    k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "seconds": 0.0, "bytes": 0.0})
    units.add((row["Metric Name"], row["Metric Unit"]))
    try:
        value = float(row["Metric Value"].replace(",", "")) * scale.get(row["Metric Unit"], 1.0)
    except ValueError:  # "n/a": a metric this kernel did not report
        value = 0.0
    k["seconds" if row["Metric Name"] == "gpu__time_duration.sum" else "bytes"] += value
def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("engine::cuda::", "").replace("engine::ops::", "")
    name = name.removeprefix("void ").split("(")[0]
    return (name[:68] + "..") if len(name) > 70 else name
total = collections.defaultdict(lambda: [0.0, 0.0, 0])
for k in kernels.values():
    t = total[short(k["name"])]
    t[0] += k["seconds"]; t[1] += k["bytes"]; t[2] += 1
print("metrics and units read:", ", ".join(f"{n} ({u})" for n, u in sorted(units)), file=sys.stderr)
step_seconds = sum(t[0] for t in total.values()) / steps
print(f"{len(kernels)} kernels in {steps} steps; the GPU's time per step {step_seconds*1e3:.1f} ms "
      f"(kernels back to back; the memory's bandwidth {bandwidth/1e9:.0f} GB/s)")
print(f"| {'kernel':<70} | ms/step | share | calls/step |  GB/s | of bandwidth | bound |")
print(f"|{'-'*72}|---------|-------|------------|-------|--------------|-------|")
for name, (s, b, n) in sorted(total.items(), key=lambda kv: -kv[1][0])[:15]:
    rate = b / s if s > 0 else 0
    gemm = any(w in name.lower() for w in ("gemm", "xmma", "cutlass", "sm90", "cudnn", "flash", "sdpa"))
    bound = "tensor" if gemm else ("memory" if rate > 0.5 * bandwidth else "latency")
    print(f"| {name:<70} | {s/steps*1e3:7.3f} | {100*s/steps/step_seconds:4.1f}% | {n/steps:10.0f} | "
          f"{rate/1e9:5.0f} | {100*rate/bandwidth if bandwidth else 0:11.1f}% | {bound:<5} |")
PY
