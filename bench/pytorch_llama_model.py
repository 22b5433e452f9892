"""The Llama the PyTorch side of bench/gpu_step.sh trains, shaped like the engine's `arch: llama`:
pre-RMSNorm blocks without biases, rotary positions, grouped-query causal attention (SDPA), a SwiGLU
MLP, a final RMSNorm and an untied LM head."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight


def rotate(x, cos, sin):  # (b, heads, t, d): the halves rotated, as Hugging Face's Llama
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, width, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.head_size = heads, kv_heads, width // heads
        kv = kv_heads * self.head_size
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(width), RMSNorm(width)
        self.qkv_proj = nn.Linear(width, width + 2 * kv, bias=False)
        self.o_proj = nn.Linear(width, width, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, width, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        kv = self.kv_heads * self.head_size
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split((c, kv, kv), dim=2)
        q = q.view(b, t, self.heads, self.head_size).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_size).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_size).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, c))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """forward(idx, targets) returns the mean cross-entropy."""

    def __init__(self, vocab, context, layers, heads, width, kv_heads, ffn, theta=10000.0):
        super().__init__()
        self.vocab = vocab
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        head_size = width // heads
        inverse = 1.0 / theta ** (torch.arange(0, head_size, 2).float() / head_size)
        angles = torch.outer(torch.arange(context).float(), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        cos, sin = self.cos[:t].to(torch.bfloat16), self.sin[:t].to(torch.bfloat16)
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))
