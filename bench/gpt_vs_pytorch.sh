#!/usr/bin/env bash
# Trains the same GPT (bench/gpt-bench.yaml: 6 layers, d_model 384, 6 heads, context 256, batch 8,
# GPT-2 vocabulary) with this engine and with PyTorch on this machine, in one run, and prints
# tokens/s of both, their ratio and each one's MFU: the model FLOPs of a step (the engine's plan:
# 3x the forward matmuls) at that rate over the machine's fp32 GEMM peak (the engine's probe). Both use 2 threads; PyTorch's Debian build gets
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
read -r engine_tps engine_mfu model_flops peak < <("$python" bench/engine_figures.py "$out/gpt-bench")
torch_tps=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} OMP_NUM_THREADS=2 "$python" bench/pytorch_gpt.py 50257 256 6 6 384 8 "$steps" 2> "$out/torch.log" |
            sed -n 's/^tokens_per_second=//p')
torch_version=$("$python" -c 'import torch; print(torch.__version__)')

printf '\nGPT 6 layers, d_model 384, 6 heads, context 256, batch 8, vocab 50257, fp32, 2 threads, %s steps\n\n' "$steps"
# MFU = model FLOPs per token x tokens/s / peak (2048 tokens per step).
torch_mfu=$(echo "$model_flops / 2048 * $torch_tps / $peak" | bc -l)
printf '| %-22s | %12s | %7s |\n' "implementation" "tokens/s" "MFU"
printf '|%s|%s|%s|\n' "------------------------" "--------------" "---------"
printf '| %-22s | %12.0f | %6.1f%% |\n' "engine" "$engine_tps" "$(echo "100 * $engine_mfu" | bc -l)"
printf '| %-22s | %12.0f | %6.1f%% |\n' "PyTorch $torch_version" "$torch_tps" "$(echo "100 * $torch_mfu" | bc -l)"
printf '\nMFU: %.3g model FLOPs per step (3x the forward matmuls) over a %.1f GFLOP/s fp32 GEMM peak (2 threads, engine probe)\n' \
  "$model_flops" "$(echo "$peak / 1000000000" | bc -l)"
printf '\nengine / PyTorch = %.2fx\n' "$(echo "$engine_tps / $torch_tps" | bc -l)"
