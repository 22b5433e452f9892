#!/usr/bin/env python3
"""LoRA as PEFT trains it: the reference tests/hf/hf_test.cpp holds the engine's LoRA runs to.

  peft_reference.py train MODEL_DIR TOKENS SEQ OUT_DIR TARGETS STEPS LR
      Wraps the model in PEFT's LoRA (r 4, alpha 8, no dropout, TARGETS comma-separated), with B
      drawn at random as well as A (so the adapters matter from the first step), saves that adapter
      to OUT_DIR/adapter_start, trains it STEPS steps of plain SGD (lr LR) on the first micro-batch
      of TOKENS (the engine's: two windows of SEQ tokens), saves the result to OUT_DIR/adapter_end and
      prints {"losses": [loss before each step], "final": loss after the last}.
  peft_reference.py adapter_loss MODEL_DIR ADAPTER_DIR TOKENS SEQ
      Prints {"loss": ...} of the base model with the adapter PeftModel.from_pretrained loads.
  peft_reference.py compare ADAPTER_DIR OTHER_DIR
      Prints {"max_difference": ...} over the adapter tensors of the two adapter_model.safetensors,
      after checking both hold the same names and shapes."""
import json
import sys

import numpy
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def windows_of(tokens_file, seq):
    tokens = torch.from_numpy(numpy.fromfile(tokens_file, dtype="uint16").astype("int64"))
    return torch.stack([tokens[0:seq + 1], tokens[seq:2 * seq + 1]])


def loss_of(model, windows, seq):
    logits = model(windows[:, :seq]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


mode = sys.argv[1]
if mode == "train":
    model_dir, tokens_file, seq, out, targets, steps, lr = sys.argv[2:9]
    seq, steps, lr = int(seq), int(steps), float(lr)
    base = AutoModelForCausalLM.from_pretrained(model_dir).float()
    gpt2 = base.config.model_type == "gpt2"
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets.split(","),
                        fan_in_fan_out=gpt2, task_type="CAUSAL_LM")
    torch.manual_seed(1)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    model.save_pretrained(out + "/adapter_start")
    windows = windows_of(tokens_file, seq)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model, windows, seq)
        losses.append(float(loss))
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        final = float(loss_of(model, windows, seq))
    model.save_pretrained(out + "/adapter_end")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(json.dumps({"losses": losses, "final": final, "trainable": trainable}))
elif mode == "adapter_loss":
    model_dir, adapter_dir, tokens_file, seq = sys.argv[2:6]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir).float(), adapter_dir)
    with torch.no_grad():
        print(json.dumps({"loss": float(loss_of(model.eval(), windows_of(tokens_file, int(seq)), int(seq)))}))
elif mode == "compare":
    a = load_file(sys.argv[2] + "/adapter_model.safetensors")
    b = load_file(sys.argv[3] + "/adapter_model.safetensors")
    if sorted(a) != sorted(b) or any(a[k].shape != b[k].shape for k in a):
        print(json.dumps({"error": "different tensors", "left": sorted((k, list(v.shape)) for k, v in a.items()),
                          "right": sorted((k, list(v.shape)) for k, v in b.items())}))
        sys.exit(1)
    print(json.dumps({"max_difference": max(float((a[k].float() - b[k].float()).abs().max()) for k in a),
                      "tensors": len(a)}))
