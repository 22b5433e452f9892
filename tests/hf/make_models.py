#!/usr/bin/env python3
"""Tiny random Hugging Face models, saved by transformers as published models are, and their loss
on fixed tokens as transformers computes it: what tests/hf/hf_test.cpp starts the engine from.

  make_models.py OUT_DIR

Writes OUT_DIR/<name>/ (config.json and safetensors, from save_pretrained) for each model below,
OUT_DIR/tokens.bin (raw uint16: two windows of SEQ tokens and the one after) and
OUT_DIR/reference.json ({name: {"arch": gpt|llama, "loss": mean cross-entropy over both windows}};
a model with rope_scaling or q, k and v biases also has "loss_plain", the loss of its weights
without them).
The loss is computed in fp32 from the directory as saved (a bf16 model's rounded weights, widened)."""
import json
import os
import sys

import torch
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

SEQ = 16
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
vocab = 96
tokens = torch.randint(0, vocab, (2 * SEQ + 1,), dtype=torch.int64)
tokens.numpy().astype("uint16").tofile(os.path.join(out, "tokens.bin"))
windows = torch.stack([tokens[0:SEQ + 1], tokens[SEQ:2 * SEQ + 1]])  # the engine's first micro-batch of 2


def gpt2(tied):
    config = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        tie_word_embeddings=tied, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def llama(tied, kv_heads, rope_scaling=None, initializer_range=0.02, positions=32):
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=positions,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                         rope_scaling=rope_scaling, initializer_range=initializer_range)
    return LlamaForCausalLM(config)


def mistral():  # without a sliding window (Mistral 7B v0.2 on): Llama's architecture
    config = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                           rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None, initializer_range=0.3)
    return MistralForCausalLM(config)


def qwen2():  # Llama's architecture with biases on q, k and v, drawn here (transformers starts them at 0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, initializer_range=0.3)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(0.0, 0.5)
    return model


def loss_of(model):
    with torch.no_grad():
        logits = model(windows).logits[:, :SEQ, :]
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), windows[:, 1:].reshape(-1)))


# Rescaled rotary frequencies (Llama 3.1's rope_type llama3, and linear interpolation). The weights
# are drawn wide (std 0.3) so that attention is sharp and the positions' angles move the loss; with
# heads of 8 the frequencies' wavelengths are 6.3, 63, 628 and 6283 positions, and an original
# context of 64 (of 512 positions) keeps the first, interpolates the second and stretches the others.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
LINEAR = {"rope_type": "linear", "factor": 4.0}


models = {
    "gpt2_tied_fp32": ("gpt", gpt2(True), torch.float32, None),
    "gpt2_tied_bf16": ("gpt", gpt2(True), torch.bfloat16, None),
    "llama_gqa_untied_fp32": ("llama", llama(False, 2), torch.float32, None),
    "llama_gqa_untied_sharded": ("llama", llama(False, 2), torch.float32, "40KB"),
    "llama_tied_fp16": ("llama", llama(True, 4), torch.float16, None),
    "llama_rope_llama3": ("llama", llama(False, 2, LLAMA3, 0.3, 512), torch.float32, None),
    "llama_rope_linear": ("llama", llama(True, 2, LINEAR, 0.3), torch.float32, None),
    "mistral_fp32": ("llama", mistral(), torch.float32, None),
    "qwen2_tied_bf16": ("llama", qwen2(), torch.bfloat16, None),
}
reference = {}
for name, (arch, model, dtype, shard) in models.items():
    directory = os.path.join(out, name)
    model = model.to(dtype)
    model.save_pretrained(directory, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    # Read back as a user's from_pretrained does, in fp32: the rotary buffers are computed afresh
    # (model.float() would keep the ones model.to(dtype) rounded to 16 bits).
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    reference[name] = {"arch": arch, "loss": loss_of(model), "tied": bool(model.config.tie_word_embeddings)}
    # The loss without the feature a model is here for: how far that feature moves it.
    if getattr(model.config, "rope_scaling", None):
        plain = LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), "rope_scaling": None}))
        plain.load_state_dict(model.state_dict())
        reference[name]["loss_plain"] = loss_of(plain.float().eval())
    if arch == "llama" and model.config.model_type == "qwen2":
        with torch.no_grad():
            for layer in model.model.layers:
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    projection.bias.zero_()
        reference[name]["loss_plain"] = loss_of(model)
with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(reference, f, indent=1)
print(json.dumps(reference))
