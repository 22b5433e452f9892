#!/usr/bin/env bash
# The CPU step against the hardware and against PyTorch: three GPT shapes, each in fp32 and bf16,
# trained by this engine and by PyTorch (bf16: CPU autocast) on this machine in one run. Prints
# tokens/s, MFU (the plan's model FLOPs per step at that rate over the engine's probed GEMM peak
# of the step's compute type), the engine's bf16 speed-up over its own fp32, and then the engine's
# per-op roofline table for every run (telemetry.op_table: each op's time and its share of the
# bound set by the GEMM peak or the memory bandwidth).
#
#   bench/cpu_step.sh [STEPS]     (default 8; the first 2 steps of each run are not timed)
#
# Shapes: the benchmark GPT (bench/gpt-bench.yaml: 6 layers, d_model 384, context 256, batch 8) with
# the GPT-2 vocabulary and with 256 tokens, and GPT-2 small (bench/gpt2-small.yaml: 12 layers,
# d_model 768, context 1024, batch 2).
#   ENGINE   the engine's command (default build/engine)
#   PYTHON   the Python with PyTorch (default .venv-torch/bin/python, which `scripts/setup
#            --bench-torch` makes, else Debian's python3 and its python3-torch)
#   THREADS  threads of each side (default 2)
#   TYPES    the precisions to run (default "fp32 bf16", or "fp32" on a CPU without AVX-512: there
#            PyTorch 1.13's bf16 products run its own fallback kernel, about 150 s a step of the
#            benchmark GPT on a 2-core AVX2 EPYC)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
threads=${THREADS:-2}
read -r -a engine <<< "${ENGINE:-build/engine}"  # a command, e.g. "bash .device/run.sh engine"
default_python=/usr/bin/python3
[ -x .venv-torch/bin/python ] && default_python=.venv-torch/bin/python
python=${PYTHON:-$default_python}
# OpenBLAS (Debian's PyTorch) misdetects new CPUs; the newest core whose instructions this CPU has.
coretype=${OPENBLAS_CORETYPE:-$(python3 tests/parity/openblas_coretype.py)}
types=${TYPES:-fp32 bf16}
if [ -z "${TYPES:-}" ] && ! grep -qw avx512f /proc/cpuinfo; then
  types=fp32
  echo "cpu_step: no AVX-512 on this CPU, so fp32 only (PyTorch's bf16 would take minutes a step); TYPES=\"fp32 bf16\" forces both" >&2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The GEMM peaks and the bandwidth are probed afresh by the first run and shared by the rest: a
# figure cached in an earlier, busier moment would skew every MFU in the table.
export XDG_CACHE_HOME=$out/cache

# name | recipe | engine overrides | pytorch_gpt.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH
shapes=(
  "GPT V50257|bench/gpt-bench.yaml||50257 256 6 6 384 8"
  "GPT V256|bench/gpt-bench.yaml|model.vocab_size=256|256 256 6 6 384 8"
  "GPT-2 small|bench/gpt2-small.yaml||50257 1024 12 12 768 2"
)

torch_version=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} "$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
for shape in "${shapes[@]}"; do
  IFS='|' read -r name recipe overrides torch_args <<< "$shape"
  read -r vocab context layers heads width batch <<< "$torch_args"
  for dtype in $types; do
    run=$out/$dtype-${name// /_}
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads "${engine[@]}" train "$recipe" $overrides precision.mode="$dtype" train.steps="$steps" \
      telemetry.op_table=true telemetry.tensorboard=false run.output_dir="$run" > "$run.log" 2>&1 ||
      { cat "$run.log" >&2; exit 1; }
    read -r tps mfu model_flops peak < <(python3 bench/engine_figures.py "$run"/*/)
    torch_tps=$(env ${coretype:+OPENBLAS_CORETYPE=$coretype} OMP_NUM_THREADS=$threads "$python" bench/pytorch_gpt.py \
                  $vocab $context $layers $heads $width $batch "$steps" "$dtype" "$threads" 2> "$run.torch.log" |
                sed -n 's/^tokens_per_second=//p')
    [ -n "$torch_tps" ] || { cat "$run.torch.log" >&2; exit 1; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$dtype" "$tps" "$mfu" "$model_flops" "$peak" "$torch_tps" \
      $((context * batch)) >> "$out/rows.tsv"
    {
      printf '\n%s, %s (engine op table over %s steps)\n' "$name" "$dtype" "$steps"
      sed -n '/^op table/,/^total/p' "$run.log"
    } >> "$out/op_tables"
  done
done

printf '\nCPU step: engine vs PyTorch %s, %s threads, %s steps (2 untimed)\n\n' "$torch_version" "$threads" "$steps"
python3 - "$out/rows.tsv" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
fp32 = {r[0]: float(r[2]) for r in rows if r[1] == "fp32"}
print("| shape       | type | engine tok/s |   MFU | PyTorch tok/s |   MFU | engine/PyTorch | bf16/fp32 | peak GFLOP/s |")
print("|-------------|------|-------------:|------:|--------------:|------:|---------------:|----------:|-------------:|")
for name, dtype, tps, mfu, flops, peak, torch_tps, tokens in rows:
    tps, mfu, flops, peak, torch_tps, tokens = map(float, (tps, mfu, flops, peak, torch_tps, tokens))
    torch_mfu = flops / tokens * torch_tps / peak
    speedup = f"{tps / fp32[name]:.2f}x" if dtype == "bf16" and name in fp32 else ""
    print(f"| {name:<11} | {dtype} | {tps:12.0f} | {100 * mfu:4.1f}% | {torch_tps:13.0f} | {100 * torch_mfu:4.1f}% "
          f"| {tps / torch_tps:13.2f}x | {speedup:>9} | {peak / 1e9:12.0f} |")
PY
printf '\nMFU: model FLOPs per step (3x the forward matmuls, from the plan) at that rate over the engine'"'"'s\n'
printf 'probed GEMM peak for the step'"'"'s compute type (last column); both sides are rated against it.\n'
# A probe taken while other processes held the cores reads low (docs/telemetry.md): say so here.
grep -h '^note: the peak was probed' "$out"/*.log | sort -u || true
cat "$out/op_tables"
