"""Tokenizers for the data-preparation test (tests/hf/hf_test.cpp), made with the tokenizers package:
a byte-level BPE as GPT-2's (trained on a small corpus, with <|endoftext|>), and a word-level one
with a vocabulary past 65536 (so its ids need 32 bits, as Llama 3's do). Writes, under DIR:

  bpe/tokenizer.json, bpe/tokenizer_config.json (eos_token, a ChatML chat_template), corpus.txt,
  docs.jsonl, chat.jsonl (prompt and response fields), conversations.jsonl (messages)
  wide/tokenizer.json (eos "</s>"), wide.txt
  nfc/tokenizer.json, nfkc/tokenizer.json: the bpe one after an NFC (Qwen's, GPT-NeoX's) or NFKC normalizer
  split/tokenizer.json: Llama 3's shape (its Split regex, then a ByteLevel without one; ignore_merges)
  sp/tokenizer.json: Llama 2's SentencePiece shape (Prepend and Replace normalizers, BPE over code
  points with byte fallback to <0xXX> tokens, <s> before every sequence); metaspace/tokenizer.json:
  the same model with the Metaspace pre-tokenizer instead (prepend_scheme "first")
  expected.json: the ids each tokenizer gives the inputs, end-of-text after each document,
  chat.jsonl's loss mask (0 for the prompts' tokens), and conversations.jsonl's ids as transformers'
  apply_chat_template gives them, with the mask of their assistant turns, and the ids the bpe and
  split tokenizers give each of `round_trip_texts` (non-ASCII, numbers, whitespace runs, added tokens)

    python tests/hf/make_tokenizers.py DIR
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

out = sys.argv[1]
os.makedirs(os.path.join(out, "bpe"), exist_ok=True)
os.makedirs(os.path.join(out, "wide"), exist_ok=True)
os.makedirs(os.path.join(out, "split"), exist_ok=True)
os.makedirs(os.path.join(out, "sp"), exist_ok=True)
os.makedirs(os.path.join(out, "metaspace"), exist_ok=True)

corpus = ("The quick brown fox jumps over the lazy dog. " * 20 + "Ünïcode text, too: naïve café. ") * 3
documents = ["First document: the fox.", "Second one, with a café and numbers 12345."]
with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
    f.write(corpus)
with open(os.path.join(out, "docs.jsonl"), "w", encoding="utf-8") as f:
    for d in documents:
        f.write(json.dumps({"text": d, "id": len(d)}) + "\n")

chats = [{"prompt": "Q: what jumps?", "response": " A: the fox."}, {"prompt": "Q: and the dog?", "response": " Lazy."}]
with open(os.path.join(out, "chat.jsonl"), "w", encoding="utf-8") as f:
    for c in chats:
        f.write(json.dumps(c) + "\n")

conversations = [
    [{"role": "system", "content": "Be <brief> & café."}, {"role": "user", "content": "What jumps?"},
     {"role": "assistant", "content": "The fox."}, {"role": "user", "content": "And the dog?"},
     {"role": "assistant", "content": "Lazy."}],
    [{"role": "user", "content": "Café?"}, {"role": "assistant", "content": "Naïve."}],
]
with open(os.path.join(out, "conversations.jsonl"), "w", encoding="utf-8") as f:
    for c in conversations:
        f.write(json.dumps({"messages": c}) + "\n")
# ChatML, with the tojson transformers' Jinja environment defines (it escapes neither HTML nor
# non-ASCII, as jinja2's own does).
chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{% if m['role'] == 'system' %}{{ m['content'] | tojson }}{% else %}{{ m['content'] }}{% endif %}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

round_trip_texts = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcode: naïve café, Ελληνικά, 日本語, emoji 🦊!",
    "Numbers 1234567 and 3.14159; it's THEY'RE we'll",
    "  leading spaces\n\n\ttabs\r\n and   runs   of spaces  ",
    "<|endoftext|>an added token<|im_start|>user\nhi<|im_end|>",
    "non\u00a0breaking\u3000spaces, wait\u00a0\u00a0!\u2003end",
    "",
    # Decomposed accents (NFC composes them), a ligature and a circled digit (NFKC replaces them).
    "cafe\u0301 and Ame\u0301lie, \ufb01ne \u2460 Angstro\u0308m \u212b",
]
# Both byte-level tokenizers learn merges across what the round trip exercises (runs of spaces,
# digits, non-ASCII letters), so splitting them differently changes the ids.
training = [corpus] + round_trip_texts * 30

bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(training, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
bpe.save(os.path.join(out, "bpe", "tokenizer.json"))
with open(os.path.join(out, "bpe", "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "chat_template": chat_template}, f)
eos = bpe.token_to_id("<|endoftext|>")
# Qwen's and GPT-NeoX's shape: the same byte-level BPE after a Unicode normalizer.
normalizing = {}
for form, normalizer in (("nfc", normalizers.NFC()), ("nfkc", normalizers.NFKC())):
    os.makedirs(os.path.join(out, form), exist_ok=True)
    normalizing[form] = Tokenizer.from_file(os.path.join(out, "bpe", "tokenizer.json"))
    normalizing[form].normalizer = normalizer
    normalizing[form].save(os.path.join(out, form, "tokenizer.json"))

# Llama 3's pre-tokenizer: its regex splits (numbers in threes, case-insensitive contractions), then
# bytes are mapped without GPT-2's regex; whole pieces found in the vocabulary skip the merges.
llama3_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
split = Tokenizer(models.BPE(ignore_merges=True))
split.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(llama3_pattern), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
split.decoder = decoders.ByteLevel()
# Llama 3's post-processor: <|begin_of_text|> before every sequence (special tokens are added).
split.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                     special_tokens=[("<|begin_of_text|>", 0)])
split.train_from_iterator(training, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin_of_text|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
split.save(os.path.join(out, "split", "tokenizer.json"))
# A whole word in the vocabulary that no merge reaches: only ignore_merges encodes it as one id.
with open(os.path.join(out, "split", "tokenizer.json"), encoding="utf-8") as f:
    split_json = json.load(f)
assert "\u0120zzzz" not in split_json["model"]["vocab"]
split_json["model"]["vocab"]["\u0120zzzz"] = len(split_json["model"]["vocab"]) + len(split_json["added_tokens"])
with open(os.path.join(out, "split", "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(split_json, f, ensure_ascii=False)
split = Tokenizer.from_file(os.path.join(out, "split", "tokenizer.json"))
round_trip_texts.append("a zzzz word")  # not in the training texts: no merge makes \u0120zzzz

# Llama 2's SentencePiece shape: merges learned over code points with spaces as "▁", then the 256
# byte tokens added to the vocabulary for what it lacks (the emoji, CJK letters and others).
llama2_normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
# Learned word by word, as SentencePiece's merges never cross a "▁" after the first symbol.
learner = Tokenizer(models.BPE(unk_token="<unk>"))
learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
learner.train_from_iterator(training, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
learned = json.loads(learner.to_str())["model"]
sp_vocab = dict(learned["vocab"])
for b in range(256):
    sp_vocab[f"<0x{b:02X}>"] = len(sp_vocab)
sp_merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]


def sentencepiece(metaspace):
    t = Tokenizer(models.BPE(sp_vocab, sp_merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:
        t.normalizer = llama2_normalizer
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.add_special_tokens(["<unk>", "<s>", "</s>"])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return t


# The last text's letters and emoji are in no training text: they take the byte fallback.
sp_texts = [t for t in round_trip_texts if "<|" not in t] + ["<s>hi</s> there", "a\u2581b",
                                                             "zebra \u03a9\U0001f40d \u4e2d\u6587!"]
sp_expected = {}
for shape in ("sp", "metaspace"):
    t = sentencepiece(shape == "metaspace")
    t.save(os.path.join(out, shape, "tokenizer.json"))
    ids = [t.encode(x, add_special_tokens=False).ids for x in sp_texts]
    sp_expected[shape] = ids
    sp_expected[shape + "_special"] = [t.encode(x).ids for x in sp_texts]
    sp_expected[shape + "_decoded"] = [t.decode(i, skip_special_tokens=False) for i in ids]
    assert any(i >= sp_vocab["<0x00>"] for i in ids[-1]), "the byte fallback is not exercised"

words = ["</s>"] + [f"w{i}" for i in range(70000)]
wide = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="</s>"))
wide.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
wide.save(os.path.join(out, "wide", "tokenizer.json"))
wide_text = " ".join(f"w{(i * 7919) % 70000}" for i in range(400))
with open(os.path.join(out, "wide.txt"), "w") as f:
    f.write(wide_text)

# The reference: transformers renders and encodes the conversations; an assistant turn's tokens are
# those between the generation prompt and the end of the turn's rendering.
from transformers import PreTrainedTokenizerFast  # noqa: E402

reference = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "bpe", "tokenizer.json"),
                                    clean_up_tokenization_spaces=False)
reference.chat_template = chat_template
conversation_ids, conversation_mask = [], []
for c in conversations:
    ids = reference.apply_chat_template(c, tokenize=True)
    mask = [0] * len(ids)
    for i, m in enumerate(c):
        if m["role"] == "assistant":
            begin = len(reference.apply_chat_template(c[:i], tokenize=True, add_generation_prompt=True))
            end = len(reference.apply_chat_template(c[:i + 1], tokenize=True))
            mask[begin:end] = [1] * (end - begin)
    conversation_ids += ids
    conversation_mask += mask

normalized = {}
for form, t in normalizing.items():
    ids = [t.encode(x, add_special_tokens=False).ids for x in round_trip_texts]
    normalized[form] = {"ids": ids, "decoded": [t.decode(i, skip_special_tokens=False) for i in ids]}
expected = {
    "corpus": bpe.encode(corpus, add_special_tokens=False).ids + [eos],
    "jsonl": sum((bpe.encode(d, add_special_tokens=False).ids + [eos] for d in documents), []),
    "wide": wide.encode(wide_text, add_special_tokens=False).ids + [0],
    "bpe_vocab": bpe.get_vocab_size(),
    "chat": sum((bpe.encode(c["prompt"], add_special_tokens=False).ids +
                 bpe.encode(c["response"], add_special_tokens=False).ids + [eos] for c in chats), []),
    "round_trip_texts": round_trip_texts,
    "round_trip_bpe": [bpe.encode(t, add_special_tokens=False).ids for t in round_trip_texts],
    "round_trip_split": [split.encode(t, add_special_tokens=False).ids for t in round_trip_texts],
    "round_trip_split_special": [split.encode(t).ids for t in round_trip_texts],
    "normalized": normalized,
    "sp_texts": sp_texts,
    "sentencepiece": sp_expected,
    # Half of a two-byte character ("Ã" is byte 0xc3 in the byte alphabet): the library's decoder
    # replaces what is not UTF-8 with U+FFFD.
    "half_character_id": bpe.token_to_id("\u00c3"),
    "half_character_decoded": bpe.decode([bpe.token_to_id("\u00c3")]),
    "conversations": conversation_ids,
    "conversations_mask": conversation_mask,
    "chat_mask": sum(([0] * len(bpe.encode(c["prompt"], add_special_tokens=False).ids) +
                      [1] * (len(bpe.encode(c["response"], add_special_tokens=False).ids) + 1) for c in chats), []),
}
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
