#!/usr/bin/env bash
# The optimizer update against the memory bandwidth and against PyTorch, measured in one run on this
# machine with 2 threads: the STREAM triad (3 arrays of 256 MiB, 12 bytes per element as STREAM counts
# them), the engine's AdamW (28 bytes per parameter) on its widest path and on AVX2, SGD with momentum
# (20 bytes), and PyTorch's torch.optim.AdamW (foreach, and fused where torch has it on the CPU), all
# over N parameters (default 64M), best of R steps (default 10). Prints one markdown table.
#
#   bench/adamw_vs_pytorch.sh [N] [R]          (ADAMW_BENCH=build/adamw_bench, PYTHON=/usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-67108864}
repeats=${2:-10}
bench=${ADAMW_BENCH:-build/adamw_bench}
python=${PYTHON:-/usr/bin/python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

OMP_NUM_THREADS=2 "$bench" --params "$n" --triad-mib 256 --repeats "$repeats" > "$out/engine.tsv"
OMP_NUM_THREADS=2 "$python" bench/pytorch_adamw.py "$n" "$repeats" > "$out/torch.tsv"
torch_version=$("$python" -c 'import torch; print(torch.__version__)')

printf '\n%s parameters, fp32, best of %s; threads: engine %s, PyTorch %s\n\n' "$n" "$repeats" \
  "$(sed -n 's/^threads\t//p' "$out/engine.tsv")" "$(sed -n 's/^threads\t//p' "$out/torch.tsv")"
awk -F'\t' -v torch="PyTorch $torch_version" '
  function row(name, bytes, rate, gbs) {
    printf "| %-34s | %5s | %10.1f | %7.2f | %5.0f%% |\n", name, bytes, rate / 1e6, gbs, 100 * gbs / triad
  }
  FNR == NR && $1 == "triad" { triad = $3 }
  FNR == NR && $1 != "threads" { rates[++count] = $0 }
  FNR != NR && $1 != "threads" { torch_rows[++torch_count] = $0 }
  END {
    printf "| %-34s | %5s | %10s | %7s | %6s |\n", "kernel", "B/el", "M el/s", "GB/s", "triad"
    printf "|%s|%s|%s|%s|%s|\n", "------------------------------------", "-------", "------------", "---------", "--------"
    for (i = 1; i <= count; ++i) {
      split(rates[i], f, "\t")
      name = f[1] == "triad" ? "STREAM triad" : "engine " f[1]
      bytes = f[1] == "triad" ? 12 : f[1] ~ /^sgd/ ? 20 : 28
      row(name, bytes, f[2], f[3])
    }
    for (i = 1; i <= torch_count; ++i) {
      split(torch_rows[i], f, "\t")
      if (f[2] != "-") row(torch " AdamW " f[1], 28, f[2], f[2] * 28 / 1e9)
      else {
        printf "| %-34s | %5s | %10s | %7s | %6s |\n", torch " AdamW " f[1], 28, "n/a", "n/a", "n/a"
        notes = notes "\n" f[1] ": " f[3]
      }
    }
    if (notes != "") print notes
    print "\nGB/s counts the bytes named (triad 12 per element, as STREAM does: its stores also read the line"
    print "first, 16 bytes of traffic); the in-place updates read every line they write, so they can pass 100%."
  }' "$out/engine.tsv" "$out/torch.tsv"
