#!/usr/bin/env python3
"""The loss transformers computes for a model directory on the first micro-batch of a token file,
as tests/hf/hf_test.cpp's runs read it (two windows of SEQ tokens, raw uint16), after
from_pretrained reports what it could not place.

  loss_of.py MODEL_DIR TOKENS SEQ

Prints {"loss": ..., "missing": [...], "unexpected": [...], "mismatched": [...]} as JSON."""
import json
import sys

import numpy
import torch
from transformers import AutoModelForCausalLM

directory, tokens_file, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
tokens = torch.from_numpy(numpy.fromfile(tokens_file, dtype="uint16").astype("int64"))
windows = torch.stack([tokens[0:seq + 1], tokens[seq:2 * seq + 1]])
with torch.no_grad():
    logits = model.float().eval()(windows).logits[:, :seq, :]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
print(json.dumps({"loss": float(loss), "missing": list(info["missing_keys"]),
                  "unexpected": list(info["unexpected_keys"]), "mismatched": [str(m) for m in info["mismatched_keys"]]}))
