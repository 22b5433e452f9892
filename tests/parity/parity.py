#!/usr/bin/env python3
"""Parity with PyTorch: the same GPT, Llama or MLP, the same initial weights, the same batches, the
same optimizer (AdamW, or SGD plain, with momentum or with Nesterov momentum, all with weight decay)
and cosine-with-warmup schedule, trained by this engine and by PyTorch (Debian's python3-torch, fp32,
CPU). Compares every parameter gradient after the first backward and again at step GRAD_STEP (after
three updates, so the optimizer state and the schedule are in them), and the loss and learning
rate of every step.

  parity.py ENGINE ARCH WORKDIR [PRECISION] [--optimizer OPT] [--batches DUMP_BATCHES]
    ARCH: gpt | llama | llama_gqa | mlp; PRECISION: fp32 (default) | bf16
    OPT: adamw (default) | sgd | momentum | nesterov
    DUMP_BATCHES: the dump_batches tool (mlp: the classification batches come from the engine)

The Llama reference is Hugging Face's LlamaAttention written in plain torch (transformers is not a
dependency): separate q_proj, k_proj and v_proj under Hugging Face's names, rotate_half rotary, and
for llama_gqa grouped-query attention (4 query heads sharing 2 key/value heads, repeat_kv). The
weights are written as a Hugging Face file, so parity also proves such a file loads unchanged.

Exit 0 when within tolerance (fp32 - loss: relative 1e-5 per step; gradients: 1e-4 relative to each
tensor's largest entry); prints a table of the worst errors either way.

bf16 compares the engine's precision.mode bf16 with PyTorch's CPU autocast to bf16. The two round
at different places (autocast runs matmuls in bf16 but keeps layer norms, the residual stream and
the loss in fp32; the engine stores every activation in bf16), so they agree to bf16 rounding:
loss within 2e-3 relative per step (measured: 3.9e-4), gradients at steps 1 and 4 within 5e-2 of each tensor's
largest entry (measured: 2.5e-2 at step 1, 2.0e-2 at step 4). On a CPU without AVX-512, PyTorch
1.13's bf16 mm/matmul accumulates in bf16 (a 512-term product errs by 4-5%; its linear's addmm
does not, but its backward's products do), so there the reference keeps autocast's casts but
computes its products in fp32 and says so (measured on an AVX2 EPYC: 2.3e-2; against PyTorch's own
bf16 products it was 6.8e-2).

SGD runs use lr 0.1 (cosine to 0.01), momentum 0.9 where it applies and weight decay 0.01 on the
matrices (as AdamW's 0.1 is), so the 20 steps move the weights visibly. fp32 measured: loss 2.9e-7,
gradients 8.5e-7 (GPT, Llama, MLP; AdamW and every SGD variant).
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas_coretype  # noqa: E402

openblas_coretype.configure()  # before torch loads OpenBLAS
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"parity: cannot import PyTorch into {sys.executable} ({e}). Install Debian's python3-torch: "
             "scripts/setup --deps installs it (or: apt-get install python3-torch)")

cli = argparse.ArgumentParser()
cli.add_argument("engine")
cli.add_argument("variant", choices=["gpt", "llama", "llama_gqa", "mlp"])
cli.add_argument("work")
cli.add_argument("precision", nargs="?", default="fp32", choices=["fp32", "bf16"])
cli.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd", "momentum", "nesterov"])
cli.add_argument("--batches")
args = cli.parse_args()
engine, variant, work, precision, opt = args.engine, args.variant, args.work, args.precision, args.optimizer
arch = "llama" if variant == "llama_gqa" else variant
LOSS_TOL, GRAD_TOL = (1e-5, 1e-4) if precision == "fp32" else (2e-3, 5e-2)
os.makedirs(work, exist_ok=True)
torch.manual_seed(1234)
torch.set_num_threads(2)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH, BATCH, STEPS = 64, 32, 2, 2, 32, 4, 20
INPUT, HIDDEN, CLASSES, MLP_BATCH = 16, 32, 8, 16  # mlp
GRAD_STEP = 4  # the second gradient comparison: after three updates
WARMUP, BETAS, EPS, CLIP, MOMENTUM = 4, (0.9, 0.95), 1e-8, 1.0, 0.9
LR, MIN_LR, DECAY = (3e-3, 3e-4, 0.1) if opt == "adamw" else (0.1, 0.01, 0.01)
if arch == "mlp":
    BATCH = MLP_BATCH
FFN = 4 * WIDTH if arch == "gpt" else (2 * 4 * WIDTH // 3 + 63) // 64 * 64
HEADS, KV_HEADS = (4, 2) if variant == "llama_gqa" else (HEADS, HEADS)
HD = WIDTH // HEADS


def bf16_product_error():
    """PyTorch's bf16 matrix product (mm) on this CPU against a double product of the same
    operands, relative to the largest entry. Accumulated in fp32 and rounded once, it errs by about
    2^-9; PyTorch 1.13's own kernel, which it uses where oneDNN has no bf16 matmul for the CPU (AVX2
    without AVX-512), accumulates mm in bf16 and errs by several percent at this depth."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 512, generator=gen).bfloat16()
    b = torch.randn(512, 64, generator=gen).bfloat16()
    exact = a.double() @ b.double()
    return ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()


# Where PyTorch's bf16 products accumulate in bf16, the reference keeps autocast's casts (operands
# and results rounded to bf16, the gradients of both too) but computes each product in fp32: the
# comparison is then with autocast's rounding, not with a weaker kernel's.
PRODUCT_ERROR = bf16_product_error() if precision == "bf16" else 0.0
FP32_PRODUCTS = PRODUCT_ERROR > 4 * 2**-8


def _rounded_product(f, *operands):
    with torch.autocast("cpu", enabled=False):
        widened = (None if x is None else x.to(torch.bfloat16).float() for x in operands)
        return f(*widened).to(torch.bfloat16)


def linear(x, w, b=None):
    return _rounded_product(F.linear, x, w, b) if FP32_PRODUCTS else F.linear(x, w, b)


def matmul(a, b):
    return _rounded_product(torch.matmul, a, b) if FP32_PRODUCTS else a @ b


def causal_attention(qkv):
    b, t, _ = qkv.shape
    q, k, v = (z.view(b, t, HEADS, HD).transpose(1, 2) for z in qkv.split(WIDTH, dim=2))
    s = matmul(q, k.transpose(-2, -1)) / math.sqrt(HD)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return matmul(s.softmax(-1), v).transpose(1, 2).reshape(b, t, WIDTH)


def rotate_half(x):
    return torch.cat([-x[..., HD // 2:], x[..., : HD // 2]], -1)


def llama_attention_params(p, h):
    """Hugging Face's Llama attention weights: q_proj (WIDTH, WIDTH), k_proj and v_proj
    (KV_HEADS x HD, WIDTH), o_proj; (out, in) as nn.Linear."""
    for name, out in [("q_proj", WIDTH), ("k_proj", KV_HEADS * HD), ("v_proj", KV_HEADS * HD), ("o_proj", WIDTH)]:
        p[h + "self_attn." + name + ".weight"] = torch.randn(out, WIDTH) * 0.1


def llama_attention(g, h, x, theta=10000.0):
    """transformers' LlamaAttention before o_proj: rotary in the rotate_half convention on q and k,
    then each key/value head repeated for the HEADS // KV_HEADS query heads that share it (repeat_kv)."""
    b, t, _ = x.shape
    q = linear(x, g(h + "self_attn.q_proj.weight")).view(b, t, HEADS, HD).transpose(1, 2)
    k = linear(x, g(h + "self_attn.k_proj.weight")).view(b, t, KV_HEADS, HD).transpose(1, 2)
    v = linear(x, g(h + "self_attn.v_proj.weight")).view(b, t, KV_HEADS, HD).transpose(1, 2)
    inv = theta ** (-torch.arange(0, HD // 2, dtype=torch.float64) * 2 / HD)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1).float(), torch.cat([angle.sin()] * 2, -1).float()
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = (z.repeat_interleave(HEADS // KV_HEADS, dim=1) for z in (k, v))
    s = matmul(q, k.transpose(-2, -1)) / math.sqrt(HD)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return matmul(s.softmax(-1), v).transpose(1, 2).reshape(b, t, WIDTH)


def llama_recipe_keys():
    return f", tie_embeddings: false, kv_heads: {KV_HEADS}" if arch == "llama" else ""


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Model(nn.Module):
    """Parameters under the engine's names, linear weights (out, in)."""

    def __init__(self):
        super().__init__()
        p = {}
        if arch == "gpt":
            p["wte.weight"] = torch.randn(VOCAB, WIDTH) * 0.1
            p["wpe.weight"] = torch.randn(CONTEXT, WIDTH) * 0.1
            for l in range(LAYERS):
                h = f"h.{l}."
                for name, shape in [("ln_1", WIDTH), ("ln_2", WIDTH)]:
                    p[h + name + ".weight"] = 1 + 0.1 * torch.randn(shape)
                    p[h + name + ".bias"] = 0.1 * torch.randn(shape)
                for name, out, inp in [("attn.c_attn", 3 * WIDTH, WIDTH), ("attn.c_proj", WIDTH, WIDTH),
                                       ("mlp.c_fc", FFN, WIDTH), ("mlp.c_proj", WIDTH, FFN)]:
                    p[h + name + ".weight"] = torch.randn(out, inp) * 0.1
                    p[h + name + ".bias"] = 0.1 * torch.randn(out)
            p["ln_f.weight"] = 1 + 0.1 * torch.randn(WIDTH)
            p["ln_f.bias"] = 0.1 * torch.randn(WIDTH)
        elif arch == "mlp":
            width = INPUT
            for l in range(LAYERS):
                p[f"layers.{l}.weight"] = torch.randn(HIDDEN, width) * 0.1
                p[f"layers.{l}.bias"] = 0.1 * torch.randn(HIDDEN)
                width = HIDDEN
            p["head.weight"] = torch.randn(CLASSES, width) * 0.1
            p["head.bias"] = 0.1 * torch.randn(CLASSES)
        else:
            p["model.embed_tokens.weight"] = torch.randn(VOCAB, WIDTH) * 0.1
            for l in range(LAYERS):
                h = f"model.layers.{l}."
                p[h + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(WIDTH)
                p[h + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(WIDTH)
                llama_attention_params(p, h)
                for name, out, inp in [("mlp.gate_proj", FFN, WIDTH), ("mlp.up_proj", FFN, WIDTH),
                                       ("mlp.down_proj", WIDTH, FFN)]:
                    p[h + name + ".weight"] = torch.randn(out, inp) * 0.1
            p["model.norm.weight"] = 1 + 0.1 * torch.randn(WIDTH)
            p["lm_head.weight"] = torch.randn(VOCAB, WIDTH) * 0.1
        self.names = list(p)
        self.params = nn.ParameterList(nn.Parameter(v.float()) for v in p.values())

    def get(self, name):
        return self.params[self.names.index(name)]

    def forward(self, idx, targets):
        g = self.get
        if arch == "mlp":  # idx: the features
            x = idx
            for l in range(LAYERS):
                x = F.gelu(linear(x, g(f"layers.{l}.weight"), g(f"layers.{l}.bias")), approximate="tanh")
            return F.cross_entropy(linear(x, g("head.weight"), g("head.bias")), targets)
        if arch == "gpt":
            x = g("wte.weight")[idx] + g("wpe.weight")[: idx.shape[1]]
            for l in range(LAYERS):
                h = f"h.{l}."
                a = F.layer_norm(x, (WIDTH,), g(h + "ln_1.weight"), g(h + "ln_1.bias"), 1e-5)
                a = causal_attention(linear(a, g(h + "attn.c_attn.weight"), g(h + "attn.c_attn.bias")))
                x = x + linear(a, g(h + "attn.c_proj.weight"), g(h + "attn.c_proj.bias"))
                m = F.layer_norm(x, (WIDTH,), g(h + "ln_2.weight"), g(h + "ln_2.bias"), 1e-5)
                m = F.gelu(linear(m, g(h + "mlp.c_fc.weight"), g(h + "mlp.c_fc.bias")), approximate="tanh")
                x = x + linear(m, g(h + "mlp.c_proj.weight"), g(h + "mlp.c_proj.bias"))
            x = F.layer_norm(x, (WIDTH,), g("ln_f.weight"), g("ln_f.bias"), 1e-5)
            logits = matmul(x, g("wte.weight").t())
        else:
            x = g("model.embed_tokens.weight")[idx]
            for l in range(LAYERS):
                h = f"model.layers.{l}."
                a = rms_norm(x, g(h + "input_layernorm.weight"))
                a = llama_attention(g, h, a)
                x = x + linear(a, g(h + "self_attn.o_proj.weight"))
                m = rms_norm(x, g(h + "post_attention_layernorm.weight"))
                m = F.silu(linear(m, g(h + "mlp.gate_proj.weight"))) * linear(m, g(h + "mlp.up_proj.weight"))
                x = x + linear(m, g(h + "mlp.down_proj.weight"))
            logits = matmul(rms_norm(x, g("model.norm.weight")), g("lm_head.weight").t())
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def write_safetensors(path, tensors):
    """The safetensors format, written directly: header length, JSON header, raw data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:end]), dtype=torch.float32).reshape(e["shape"])
    return out


model = Model()
weights = {}
for name in model.names:
    t = model.get(name)
    weights[name] = t.t() if arch == "gpt" and name.endswith(CONV1D) else t  # Hugging Face's Conv1D layout
write_safetensors(f"{work}/init.safetensors", weights)

if opt == "adamw":
    optimizer_yaml = f"{{type: adamw, lr: {LR}, betas: [{BETAS[0]}, {BETAS[1]}], eps: {EPS}, weight_decay: {DECAY}}}"
else:
    optimizer_yaml = (f"{{type: sgd, lr: {LR}, momentum: {0.0 if opt == 'sgd' else MOMENTUM}, "
                      f"nesterov: {'true' if opt == 'nesterov' else 'false'}, weight_decay: {DECAY}}}")
if arch == "mlp":
    model_yaml = (f"{{arch: mlp, n_layer: {LAYERS}, input_dim: {INPUT}, hidden_dim: {HIDDEN}, num_classes: {CLASSES}, "
                  f"activation: gelu, init_from: init.safetensors}}")
    data_yaml = f"{{source: classification, num_samples: {BATCH * STEPS}, noise: 0.5, val_fraction: 0, prefetch: 0}}"
else:
    model_yaml = (f"{{arch: {arch}, vocab_size: {VOCAB}, context_length: {CONTEXT}, n_layer: {LAYERS}, "
                  f"n_head: {HEADS}, n_embd: {WIDTH}, init_from: init.safetensors"
                  f"{llama_recipe_keys()}}}")
    data_yaml = "{source: tokens, path: tokens.bin, format: raw_uint16, shuffle: false, val_fraction: 0, prefetch: 0}"
with open(f"{work}/recipe.yaml", "w") as f:
    f.write(f"""run: {{name: parity, output_dir: {work}/runs, seed: 1}}
model: {model_yaml}
data: {data_yaml}
train: {{steps: {STEPS}, micro_batch_size: {BATCH}, gradient_clipping: {CLIP}, log_every: 1}}
optimizer: {optimizer_yaml}
scheduler: {{type: cosine, warmup_steps: {WARMUP}, min_lr: {MIN_LR}}}
precision: {{mode: {precision}}}
""")

if arch == "mlp":
    # The classification samples come from the engine's random streams: read them as it trains on them.
    subprocess.run([args.batches, f"{work}/recipe.yaml", str(STEPS), f"{work}/batches.safetensors"], check=True)
    dumped = read_safetensors(f"{work}/batches.safetensors")
    batches = [(dumped["inputs"][s], dumped["targets"][s].long()) for s in range(STEPS)]
else:
    # Raw uint16 tokens read in file order, window i of (CONTEXT + 1) tokens, stride CONTEXT.
    windows = BATCH * STEPS
    tokens = torch.randint(0, VOCAB, (windows * CONTEXT + 1,))
    with open(f"{work}/tokens.bin", "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}H", *tokens.tolist()))
    batches = []
    for step in range(STEPS):
        rows = torch.stack([tokens[(step * BATCH + b) * CONTEXT:(step * BATCH + b) * CONTEXT + CONTEXT + 1]
                            for b in range(BATCH)]).long()
        batches.append((rows[:, :-1], rows[:, 1:]))

subprocess.run([engine, "train", f"{work}/recipe.yaml", "--dump-first-gradients", f"{work}/grads.safetensors",
                "--dump-gradients-at", str(GRAD_STEP), f"{work}/grads_{GRAD_STEP}.safetensors"],
               check=True, stdout=subprocess.DEVNULL)
metrics = [json.loads(l) for l in open(f"{work}/runs/parity/metrics.jsonl") if '"loss"' in l]
engine_grads = {1: read_safetensors(f"{work}/grads.safetensors"),
                GRAD_STEP: read_safetensors(f"{work}/grads_{GRAD_STEP}.safetensors")}


def engine_gradient(step, name):
    """The engine's gradient of a parameter at a step, in the model's (out, in) layout: the dump uses
    the layout of the weights files, where GPT-2's Conv1D weights are (in, out)."""
    e = engine_grads[step][name]
    return e.t() if arch == "gpt" and name.endswith(CONV1D) else e


def schedule(step):  # the engine's cosine with linear warmup, as a LambdaLR factor
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    return (MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))) / LR


decay = [p for n, p in zip(model.names, model.params) if p.dim() >= 2]
no_decay = [p for n, p in zip(model.names, model.params) if p.dim() < 2]
groups = [{"params": decay, "weight_decay": DECAY}, {"params": no_decay, "weight_decay": 0.0}]
if opt == "adamw":
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
else:
    optimizer = torch.optim.SGD(groups, lr=LR, momentum=0.0 if opt == "sgd" else MOMENTUM, nesterov=opt == "nesterov")
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

failures, worst_loss, worst_lr, grad_rows = [], 0.0, 0.0, []
for step in range(STEPS):
    inputs, targets = batches[step]
    optimizer.zero_grad()
    lr = scheduler.get_last_lr()[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(inputs, targets)
    loss.float().backward()
    if step + 1 in engine_grads:
        for name, p in zip(model.names, model.params):
            e, t = engine_gradient(step + 1, name), p.grad
            err = ((e - t).abs().max() / t.abs().max().clamp_min(1e-12)).item()
            grad_rows.append((err, f"{name} (step {step + 1})"))
            if err > GRAD_TOL:
                failures.append(f"step {step + 1} gradient of {name}: relative error {err:.3g}")
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    scheduler.step()
    m = metrics[step]
    rel = abs(m["loss"] - loss.item()) / abs(loss.item())
    worst_loss = max(worst_loss, rel)
    worst_lr = max(worst_lr, abs(m["lr"] - lr) / lr)
    if rel > LOSS_TOL:
        failures.append(f"step {step + 1}: loss {m['loss']:.9g} (engine) vs {loss.item():.9g} (PyTorch), relative {rel:.3g}")
    if abs(m["lr"] - lr) / lr > 1e-9:
        failures.append(f"step {step + 1}: lr {m['lr']:.9g} (engine) vs {lr:.9g} (torch LambdaLR)")

grad_rows.sort(reverse=True)
print(f"{variant} {precision} {opt}: {STEPS} steps against PyTorch {torch.__version__}" +
      (" CPU autocast to bf16" if precision == "bf16" else ""))
if FP32_PRODUCTS:
    print(f"  PyTorch's bf16 products accumulate in bf16 on this CPU (error {PRODUCT_ERROR:.2g} over 512 terms):"
          " the reference rounds at autocast's places and computes its products in fp32")
print(f"  worst loss relative error: {worst_loss:.3g} (limit {LOSS_TOL:g})")
print(f"  worst lr relative error:   {worst_lr:.3g}")
print(f"  worst gradient errors at steps 1 and {GRAD_STEP} (relative to the tensor's largest entry, limit {GRAD_TOL:g}):")
for err, name in grad_rows[:4]:
    print(f"    {err:.3g}  {name}")
for f in failures:
    print("FAIL: " + f)
sys.exit(1 if failures else 0)
