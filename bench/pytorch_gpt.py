#!/usr/bin/env python3
"""The PyTorch side of bench/gpt_vs_pytorch.sh and bench/memory_levers.sh: the same GPT (pre-LN,
GELU tanh, tied head, causal attention), the same batch, AdamW and gradient clipping, timed per
step after warm-up.

  pytorch_gpt.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS [MODE [THREADS]]
  MODE: fp32 (default) | bf16 (CPU autocast) | checkpoint (fp32, torch.utils.checkpoint per block)
  THREADS: default 2

Prints tokens_per_second=<value> and peak_rss_bytes=<value>."""
import resource
import sys
import time

import torch

from pytorch_gpt_model import GPT

vocab, context, layers, heads, width, batch, steps = (int(a) for a in sys.argv[1:8])
mode = sys.argv[8] if len(sys.argv) > 8 else "fp32"
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[9]) if len(sys.argv) > 9 else 2)
torch.set_flush_denormal(True)  # as the engine does: denormals are 100x slower on x86

model = GPT(vocab, context, layers, heads, width, checkpoint=mode == "checkpoint")
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
tokens = torch.randint(0, vocab, (batch, context + 1))
times = []
for step in range(steps):
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
        loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.float().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    times.append(time.perf_counter() - start)
    print(f"step {step}: {times[-1]:.2f} s", file=sys.stderr)
measured = times[2:]  # the first steps warm up allocators and kernels
print(f"tokens_per_second={batch * context * len(measured) / sum(measured):.1f}")
print(f"peak_rss_bytes={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}")
