"""The GPT the PyTorch side of the benchmarks trains, shaped like the engine's `arch: gpt`: pre-LN
blocks with biases, GELU (tanh), causal attention, a final LayerNorm and an LM head tied to the
token embedding. bench/pytorch_gpt.py trains it in one process, bench/pytorch_distributed.py on
several."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.width, self.heads = width, heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.c_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(self.width, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch 2; 1.13 has only the explicit form
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            a = s.softmax(-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.c_out(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """forward(idx, targets) returns the mean cross-entropy; checkpoint=True recomputes each block
    in the backward pass (torch.utils.checkpoint)."""

    def __init__(self, vocab, context, layers, heads, width, checkpoint=False):
        super().__init__()
        self.vocab, self.checkpoint = vocab, checkpoint
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
