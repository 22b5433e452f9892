#!/usr/bin/env python3
"""The PyTorch side of bench/gpt_vs_pytorch.sh and bench/memory_levers.sh: the same GPT (pre-LN,
GELU tanh, tied head, causal attention), the same batch, AdamW and gradient clipping, timed per
step after warm-up.

  pytorch_gpt.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS [MODE]
  MODE: fp32 (default) | bf16 (CPU autocast) | checkpoint (fp32, torch.utils.checkpoint per block)

Prints tokens_per_second=<value> and peak_rss_bytes=<value>."""
import math
import resource
import sys
import time

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

vocab, context, layers, heads, width, batch, steps = (int(a) for a in sys.argv[1:8])
mode = sys.argv[8] if len(sys.argv) > 8 else "fp32"
torch.manual_seed(0)
torch.set_num_threads(2)
torch.set_flush_denormal(True)  # as the engine does: denormals are 100x slower on x86


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.c_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else None
        if a is None:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(c // heads)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            a = s.softmax(-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.c_out(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.h = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            if mode == "checkpoint":
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))


model = GPT()
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
