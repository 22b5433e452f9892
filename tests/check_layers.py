#!/usr/bin/env python3
"""The direction of the engine's includes: a layer includes its own and lower layers only.

Layers, lowest first (a directory of engine/ or ops/ each; ops' families are one layer):

  core                      types, errors, formatting, the CPU's features
  graph                     values, nodes, ops' definitions, autodiff
  ops                       the kernels (elementwise, linalg, loss, nn, parallel, reduce, shape)
  plan                      memory plans of a graph
  lua, recipe               recipes and the plugins' sandbox
  models, data              model graphs and datasets
  offload, optim, dist, runtime, telemetry
                            where state lives, the optimizer, ZeRO, the executor, what a run
                            measures (the executor and the swap files trace themselves)
  checkpoint                what a run saves
  trainer                   a session and the training loop
  golden, report, cli, main the commands

An include from a lower layer into a higher one fails this check unless it is listed in KNOWN
below, each with why it is still there: that list is the debt, and it may only shrink. Within a
layer, directories include each other freely (offload, optim, dist and runtime do, both ways). Run it
from the repository root (ctest runs it as the `include_layers` test, label hygiene).
"""
import os
import re
import sys

LAYERS = [
    ["core"],
    ["graph"],
    ["ops", "elementwise", "linalg", "loss", "nn", "parallel", "reduce", "shape"],
    ["plan"],
    ["lua", "recipe"],
    ["models", "data"],
    ["offload", "optim", "dist", "runtime", "telemetry"],
    ["checkpoint"],
    ["trainer"],
    ["golden", "report", "cli", "main"],
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# (from directory, to directory): why the upward include is still there.
KNOWN = {
    ("core", "nn"): "core/device_info_cuda.cu reports cuDNN's SDPA support from nn/attention_cudnn.h",
    ("graph", "elementwise"): "graph/precision.cpp inserts cast nodes (elementwise/cast.h)",
    ("graph", "ops"): "graph/autodiff.cpp and graph/recompute.cpp define the copy ops they insert, whose "
    "CUDA kernels are ops/cuda_kernels.h's",
    ("graph", "recipe"): "graph/recompute.h takes the recipe's activation_checkpointing section",
}
# Gone, and kept out by this check: graph -> plan (value_bytes is graph/graph.h's now) and
# telemetry -> trainer (the number formatting is core/format.h's).

def layer_of(path):
    parts = path.split(os.sep)
    if parts[0] == "ops":
        return "ops" if len(parts) == 2 else parts[1]
    return "main" if len(parts) == 2 else parts[1]


def target_of(include, including_dir):
    """The layer an include names: its first directory, or ops' for a bare name of ops/'s top level
    (cuda_kernels.h, op_util.h, ...), which every file may include by name."""
    m = re.match(r"([a-z_]+)/", include)
    if m:
        return m.group(1)
    if "/" not in include and not os.path.exists(os.path.join(including_dir, include)):
        if os.path.exists(os.path.join("ops", include)):
            return "ops"
    return None


def main():
    failures = []
    used = set()
    for root in ("engine", "ops"):
        for directory, _, files in os.walk(root):
            for name in files:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(directory, name)
                source = layer_of(path)
                with open(path, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = re.match(r'\s*#include "([^"]+)"', line)
                        if not m:
                            continue
                        target = target_of(m.group(1), directory)
                        if target not in RANK or source not in RANK or RANK[target] <= RANK[source]:
                            continue
                        if (source, target) in KNOWN:
                            used.add((source, target))
                        else:
                            failures.append(f"{path}:{number}: {source} includes {m.group(1)} ({target}), a higher layer")
    for stale in sorted(set(KNOWN) - used):
        failures.append(f"tests/check_layers.py: {stale[0]} -> {stale[1]} is listed as known but no longer "
                        "happens: take it off the list")
    for failure in failures:
        print(failure)
    if failures:
        print(f"{len(failures)} upward include(s); see tests/check_layers.py for the layers")
        return 1
    print(f"includes keep the layers' direction ({len(KNOWN)} known exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
