"""Make the tokenizer families of tests/data/tokenizers/: small vocabularies trained on the shipped KJV corpus, each
inside the pipeline of a published tokenizer.json (normalizer, pre-tokenizer and its split regex, model options,
decoder, post-processor, added and special tokens), built with `tokenizers` itself.

    .venv/bin/python tools/make_test_tokenizers.py [OUT_DIR]   (default tests/data/tokenizers)

What must match a published file is the pipeline, not the size: the engines' proofs and the family tests
(tests/tokenizers/test_tokenizer_families.py) exercise every stage. The published files copied, option for option:
- llama3: meta-llama/Meta-Llama-3-8B `tokenizer.json` (also 3.1, 3.2): no normalizer; Split(Llama 3's regex,
  Isolated) + ByteLevel(use_regex=false); BPE ignore_merges; 256 special tokens after the vocabulary
  (<|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_N|>, <|start_header_id|>, <|eot_id|>, ...);
  post-processor ByteLevel + TemplateProcessing "<|begin_of_text|> $A"; ByteLevel decoder.
- qwen2: Qwen/Qwen2.5-7B `tokenizer.json` (Qwen2, Qwen3 alike): NFC normalizer; Split(Qwen's regex: single
  digits) + ByteLevel(use_regex=false); BPE; special tokens <|endoftext|>, <|im_start|>, <|im_end|>, the vision
  and box markers, and the added tokens that are NOT special (<tool_call>, <|fim_prefix|>, ..., Qwen3's <think>):
  `tokenizers` matches those inside documents; ByteLevel post-processor and decoder.
- llama2: meta-llama/Llama-2-7b-hf and mistralai/Mistral-7B-v0.1 `tokenizer.json`: normalizer Prepend("▁") +
  Replace(" ", "▁"), no pre-tokenizer; BPE with byte_fallback (<0x00>..<0xFF> at ids 3-258), fuse_unk, <unk>;
  <unk> <s> </s> special; TemplateProcessing "<s> $A"; decoder Replace + ByteFallback + Fuse + Strip.
- mistral: mistralai/Mistral-7B-v0.3 `tokenizer.json`: no normalizer; Metaspace(prepend_scheme="first",
  split=false) pre-tokenizer and decoder; BPE with byte_fallback; <unk> <s> </s> [INST] [/INST] [TOOL_CALLS] ...
  special; TemplateProcessing "<s> $A".
GPT-2 itself ships as tests/data/gpt2-tokenizer.json.zst.
"""

from __future__ import annotations

import io
import json
import pathlib
import sys

import zstandard
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[1]
KJV = ROOT / "tests" / "data" / "kjv.jsonl.zst"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
                   + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
                   + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
SP_SPECIALS = ["<unk>", "<s>", "</s>"]
MISTRAL_CONTROLS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                    "[/TOOL_RESULTS]"] + [f"[control_{i}]" for i in range(8, 24)]
BYTE_LEVEL_VOCAB = 4000
SP_VOCAB = 3000


def kjv_texts() -> list[str]:
    raw = zstandard.ZstdDecompressor().stream_reader(open(KJV, "rb")).read()
    return [json.loads(line)["text"] for line in io.BytesIO(raw) if line.strip()]


def _byte_level(pattern: str, texts: list[str], ignore_merges: bool, nfc: bool, trim_offsets: bool) -> Tokenizer:
    """A byte-level BPE trained on `texts` with `pattern` split first, then bytes without a second split."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=trim_offsets, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=BYTE_LEVEL_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def llama3(texts: list[str]) -> dict:
    tok = _byte_level(LLAMA3_PATTERN, texts, ignore_merges=True, nfc=False, trim_offsets=True)
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    obj = json.loads(tok.to_str())
    obj["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return obj


def qwen2(texts: list[str]) -> dict:
    from tokenizers import AddedToken

    tok = _byte_level(QWEN2_PATTERN, texts, ignore_merges=False, nfc=True, trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN2_SPECIALS])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN2_ADDED])
    obj = json.loads(tok.to_str())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    obj["post_processor"], obj["decoder"] = byte_level, dict(byte_level)
    return obj


def _sentencepiece_bpe(texts: list[str], specials: list[str]) -> dict:
    """A SentencePiece-style BPE (▁ for spaces, byte fallback) trained on words of `texts`: the JSON, its ids laid
    out as SentencePiece's: the specials, the 256 byte tokens <0x00>..<0xFF>, then the merges' tokens."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")  # words, for training only
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=SP_VOCAB, special_tokens=specials,
                                                       show_progress=False))
    obj = json.loads(tok.to_str())
    vocab = obj["model"]["vocab"]
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(vocab, key=vocab.get)
                                                                  if t not in specials]
    obj["model"]["vocab"] = {t: i for i, t in enumerate(ordered)}
    for t in obj["added_tokens"]:
        t["id"] = obj["model"]["vocab"][t["content"]]
    obj["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", obj["model"]["vocab"]["<s>"])]).__getstate__())
    return obj


def llama2(texts: list[str]) -> dict:
    obj = _sentencepiece_bpe(texts, SP_SPECIALS)
    obj["pre_tokenizer"] = None
    obj["decoder"] = json.loads(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    return obj


def mistral(texts: list[str]) -> dict:
    obj = _sentencepiece_bpe(texts, SP_SPECIALS + MISTRAL_CONTROLS)
    obj["normalizer"] = None
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    obj["pre_tokenizer"], obj["decoder"] = metaspace, dict(metaspace)
    return obj


FAMILIES = {"llama3": llama3, "qwen2": qwen2, "llama2": llama2, "mistral": mistral}


def main(out: pathlib.Path) -> None:
    texts = kjv_texts()
    for name, make in FAMILIES.items():
        text = json.dumps(make(texts), ensure_ascii=False)
        Tokenizer.from_str(text)  # loads as tokenizers reads it
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(text, encoding="utf-8")
        print(f"{folder / 'tokenizer.json'}: {len(text.encode()):,} bytes")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "tokenizers")
