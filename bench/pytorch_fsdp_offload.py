#!/usr/bin/env python3
"""The PyTorch peer of bench/gpu_offload.sh: the engine's GPT (bench/pytorch_gpt_model.py) under
FSDP2 (fully_shard per block, then the root) with CPUOffloadPolicy on one GPU: parameters,
gradients and AdamW's state in pinned host memory, the optimizer step on the CPU, bf16 compute
(MixedPrecisionPolicy), full activation checkpointing as the engine's run uses. One process (world
1), timed per step after warm-up.

  pytorch_fsdp_offload.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS

Prints tokens_per_second=<value> and peak_memory_bytes=<value> (the GPU's)."""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from pytorch_gpt_model import GPT

vocab, context, layers, heads, width, batch, steps = (int(a) for a in sys.argv[1:8])
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
if "MASTER_PORT" not in os.environ:  # a free port: an earlier run cut short may still hold a fixed one
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
torch.cuda.set_device(0)
dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
torch.manual_seed(0)
model = GPT(vocab, context, layers, heads, width, checkpoint=True)
policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=True),
              mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
for block in model.h:
    fully_shard(block, **policy)
fully_shard(model, **policy)
# The fused CPU AdamW (PyTorch 2.4 and later), the peer's fastest host update, as the engine's is.
try:
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
except (RuntimeError, TypeError, ValueError):
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
tokens = torch.randint(0, vocab, (batch, context + 1), device="cuda")
times = []
for step in range(steps):
    torch.cuda.synchronize()
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
    print(f"fsdp2 cpu offload step {step}: {times[-1] * 1000:.1f} ms loss {loss.item():.4f}", file=sys.stderr)
measured = times[1:]  # the first step allocates and warms up
print(f"tokens_per_second={batch * context * len(measured) / sum(measured):.1f}")
print(f"peak_memory_bytes={torch.cuda.max_memory_allocated()}")
dist.destroy_process_group()
