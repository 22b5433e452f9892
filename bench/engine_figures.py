#!/usr/bin/env python3
"""A finished engine run's figures for the benchmark scripts: mean tokens/s and MFU over the timed
steps (after the first 2), the model FLOPs per step and the peak they were rated against.

  engine_figures.py RUN_DIR     prints: tokens_per_second mfu model_flops_per_step peak_flops_per_rank"""
import json
import sys

run = sys.argv[1]
rows = [json.loads(line) for line in open(run + "/metrics.jsonl") if '"loss"' in line]
timed = [r for r in rows if r["step"] > 2]
summary = json.load(open(run + "/summary.json"))
print(f'{sum(r["tokens_per_second"] for r in timed) / len(timed):.1f}',
      f'{sum(r["mfu"] for r in timed) / len(timed):.6f}',
      summary["model_flops_per_step"], summary["peak_flops_per_rank"])
