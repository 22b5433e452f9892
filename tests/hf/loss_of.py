#!/usr/bin/env python3
"""The loss transformers computes for a model directory on the first micro-batch of a token file,
as tests/hf/hf_test.cpp's runs read it (two windows of SEQ tokens, raw uint16), after
from_pretrained reports what it could not place.

  loss_of.py MODEL_DIR TOKENS SEQ [MASK]

With MASK (one byte per token, data.loss_mask's), the targets whose byte is 0 are ignored
(ignore_index), and the loss is the mean over the others.

Prints {"loss": ..., "missing": [...], "unexpected": [...], "mismatched": [...]} as JSON."""
import json
import sys

import numpy
import torch
from transformers import AutoModelForCausalLM

directory, tokens_file, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
mask = numpy.fromfile(sys.argv[4], dtype="uint8") if len(sys.argv) > 4 else None
model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
tokens = torch.from_numpy(numpy.fromfile(tokens_file, dtype="uint16").astype("int64"))
windows = torch.stack([tokens[0:seq + 1], tokens[seq:2 * seq + 1]])
with torch.no_grad():
    logits = model.float().eval()(windows).logits[:, :seq, :]
    labels = windows[:, 1:].clone()
    if mask is not None:
        trained = torch.from_numpy(mask.astype("bool"))
        labels[0][~trained[1:seq + 1]] = -100
        labels[1][~trained[seq + 1:2 * seq + 1]] = -100
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100)
print(json.dumps({"loss": float(loss), "missing": list(info["missing_keys"]),
                  "unexpected": list(info["unexpected_keys"]), "mismatched": [str(m) for m in info["mismatched_keys"]]}))
