#!/usr/bin/env python3
"""The PyTorch peer of bench/gpu_step.sh on one GPU: the engine's GPT (bench/pytorch_gpt_model.py)
or Llama (bench/pytorch_llama_model.py) in bf16 autocast with SDPA attention and fused AdamW, eager
or torch.compile'd, timed per step with CUDA events after warm-up.

  pytorch_lm_cuda.py gpt   VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS MODE
  pytorch_lm_cuda.py llama VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS MODE KV_HEADS FFN
  MODE: eager | compile

Prints tokens_per_second=<value> and peak_memory_bytes=<value>."""
import sys

import torch

arch = sys.argv[1]
vocab, context, layers, heads, width, batch, steps = (int(a) for a in sys.argv[2:9])
mode = sys.argv[9]
torch.manual_seed(0)
# Built on the GPU (a 1.1B Llama's initialisation on the CPU takes seconds of the bench's budget).
with torch.device("cuda"):
    if arch == "llama":
        from pytorch_llama_model import Llama

        model = Llama(vocab, context, layers, heads, width, int(sys.argv[10]), int(sys.argv[11])).cuda()
    else:
        from pytorch_gpt_model import GPT

        model = GPT(vocab, context, layers, heads, width).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
step_fn = torch.compile(model) if mode == "compile" else model
tokens = torch.randint(0, vocab, (batch, context + 1), device="cuda")
times = []
for step in range(steps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_fn(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    stop.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(stop) / 1000)
    print(f"{mode} step {step}: {times[-1] * 1000:.1f} ms loss {loss.item():.4f}", file=sys.stderr)
measured = times[3:]  # compilation and allocator warm-up
print(f"tokens_per_second={batch * context * len(measured) / sum(measured):.1f}")
print(f"peak_memory_bytes={torch.cuda.max_memory_allocated()}")
