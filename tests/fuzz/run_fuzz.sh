#!/usr/bin/env bash
# Runs the recipe fuzz target for a bounded time from a seed corpus of shipped recipes and hostile
# files. Usage: run_fuzz.sh FUZZ_BINARY SOURCE_DIR SECONDS. New inputs go to a scratch corpus; a
# finding leaves crash-* files in the scratch directory and fails the run.
set -euo pipefail
binary=$1 source=$2 seconds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
cp "$source"/recipes/*.yaml "$source"/recipes/examples/*.yaml "$work/corpus/"
cp "$source"/tests/recipe/hostile/* "$work/corpus/"
cp "$source"/tests/fuzz/seeds/* "$work/corpus/" 2>/dev/null || true
cd "$work"
"$binary" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -dict="$source/tests/fuzz/recipe.dict" -print_final_stats=1 corpus
