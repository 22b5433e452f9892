#!/usr/bin/env bash
# Trains the same GPT (bench/gpt-bench.yaml: 6 layers, d_model 384, 6 heads, context 256, batch 8,
# GPT-2 vocabulary) with this engine and with PyTorch on this machine, in one run, and prints
# tokens/s of both and their ratio. Both use 2 threads; PyTorch's Debian build gets
# OPENBLAS_CORETYPE set from the CPU's flags so its BLAS does not misdetect the CPU.
#
#   bench/gpt_vs_pytorch.sh [STEPS]      (default 12; the first 2 steps of each are not timed)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
engine=${ENGINE:-build/engine}
python=${PYTHON:-/usr/bin/python3}
# OpenBLAS misdetects new CPUs; the newest core whose instructions this CPU has (tests/parity).
coretype=${OPENBLAS_CORETYPE:-$("$python" tests/parity/openblas_coretype.py)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

OMP_NUM_THREADS=2 "$engine" train bench/gpt-bench.yaml run.output_dir="$out" train.steps="$steps" > "$out/engine.log"
engine_tps=$("$python" - "$out/gpt-bench/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"loss"' in line]
timed = [r for r in rows if r["step"] > 2]
print(f'{sum(r["tokens_per_second"] for r in timed) / len(timed):.1f}')
PY
)
torch_tps=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} OMP_NUM_THREADS=2 "$python" bench/pytorch_gpt.py 50257 256 6 6 384 8 "$steps" 2> "$out/torch.log" |
            sed -n 's/^tokens_per_second=//p')
torch_version=$("$python" -c 'import torch; print(torch.__version__)')

printf '\nGPT 6 layers, d_model 384, 6 heads, context 256, batch 8, vocab 50257, fp32, 2 threads, %s steps\n\n' "$steps"
printf '| %-22s | %12s |\n' "implementation" "tokens/s"
printf '|%s|%s|\n' "------------------------" "--------------"
printf '| %-22s | %12.0f |\n' "engine" "$engine_tps"
printf '| %-22s | %12.0f |\n' "PyTorch $torch_version" "$torch_tps"
printf '\nengine / PyTorch = %.2fx\n' "$(echo "$engine_tps / $torch_tps" | bc -l)"
