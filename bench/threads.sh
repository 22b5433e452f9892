#!/usr/bin/env bash
# Times the quick start under OpenMP thread settings in three situations: alone, beside two busy
# processes (`yes > /dev/null`), and as two copies side by side (what `mpirun -n 2` does on one
# machine; both copies get OMPI_COMM_WORLD_LOCAL_SIZE=2 as mpirun would set it). Prints the best
# wall time of REPEATS runs per cell. See docs/threads.md for the table and what was chosen.
#
#   bench/threads.sh [REPEATS]          (default 2)
#   SETTINGS='name|VAR=VALUE ...;name|...' bench/threads.sh   (default: the rows of docs/threads.md)
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-2}
engine=${ENGINE:-build/engine}
cores=$(nproc)
settings=${SETTINGS:-"OMP_NUM_THREADS=$cores (libgomp default)|OMP_NUM_THREADS=$cores;budget|;budget, GOMP_SPINCOUNT=1000|GOMP_SPINCOUNT=1000;budget, OMP_WAIT_POLICY=passive|OMP_WAIT_POLICY=passive"}
out=$(mktemp -d)
busy=()
cleanup() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT

# One training run with the given environment assignments; the run directory is private.
train() {
  env "$@" "$engine" train recipes/quickstart.yaml run.output_dir="$(mktemp -d -p "$out")" > /dev/null 2>&1
}
seconds() {  # runs "$@" and prints its wall time
  local start end
  start=$(date +%s.%N)
  "$@"
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
pair() {
  train OMPI_COMM_WORLD_LOCAL_SIZE=2 "$@" &
  local first=$!
  train OMPI_COMM_WORLD_LOCAL_SIZE=2 "$@"
  wait "$first"
}
loaded() {
  yes > /dev/null & busy+=($!)
  yes > /dev/null & busy+=($!)
  train "$@"
  kill "${busy[@]}"; wait "${busy[@]}" 2>/dev/null || true
  busy=()
}
best() {  # the smallest of $repeats timings of "$@"
  local times=()
  for ((i = 0; i < repeats; i++)); do times+=("$(seconds "$@")"); done
  printf '%.1f' "$(printf '%s\n' "${times[@]}" | sort -g | head -1)"
}

printf '%-48s %8s %16s %16s\n' "setting" "alone" "beside 2 busy" "2 side by side"
IFS=';' read -ra rows <<< "$settings"
for row in "${rows[@]}"; do
  name=${row%%|*}
  assignments=${row#*|}
  # shellcheck disable=SC2086  # assignments are words on purpose
  printf '%-48s %7ss' "$name" "$(best train $assignments)"
  printf ' %15ss' "$(best loaded $assignments)"
  printf ' %15ss\n' "$(best pair $assignments)"
done
