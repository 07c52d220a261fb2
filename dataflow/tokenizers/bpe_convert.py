"""Turn a byte-level BPE `tokenizer.json` into a tiktoken encoding, and prove the two give the same ids.

tiktoken splits text with one regex, then merges the adjacent parts whose concatenation has the
lowest rank, and uses the rank as the token id. A Hugging Face byte-level BPE splits with its
pre-tokenizer, maps every byte to a printable character (GPT-2's byte-to-unicode table) and applies
its merge list in order. The two agree when the pre-tokenizer is one regex, nothing rewrites the text
first but NFC (which the engine applies itself, as it matches the added tokens that are not special), and merge
order is rank order. `convert` checks the structure and says why it cannot convert;
`first_mismatch` compares the engines id for id on the probe text and on a sample of real input.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dataflow import env

# The split pattern of the `ByteLevel` pre-tokenizer when `use_regex` is on (tokenizers' byte_level.rs).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotConvertible(Exception):
    """The tokenizer cannot be run by tiktoken with the same ids; the message says why."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte to a printable character, printable ASCII/Latin-1 to itself."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


@dataclass
class Conversion:
    """What tiktoken needs, plus facts the proof and the log use."""

    pat_str: str
    mergeable_ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    ignore_merges: bool
    pattern_source: str  # where the split pattern came from, for the log
    skipped: list[str] = field(default_factory=list)  # vocab entries tiktoken leaves out, and why
    normalizer: str | None = None  # the Unicode form the text is normalized to first ("NFC"), if any
    added: dict[str, int] = field(default_factory=dict)  # non-special added tokens: matched inside text
    added_normalized: bool = False  # they match the normalized text (else the text as it is, before normalizing)


def convert(obj: dict[str, Any]) -> Conversion:
    """Derive ranks, split pattern and special tokens from a parsed `tokenizer.json`.

    Raises NotConvertible naming the first feature tiktoken cannot reproduce exactly.
    """
    normalizer = _normalization(obj.get("normalizer"))
    pat_str, pattern_source = _split_pattern(obj.get("pre_tokenizer"))
    model = obj.get("model") or {}
    _check_model(model)
    ignore_merges = bool(model.get("ignore_merges", False))
    added = obj.get("added_tokens") or []
    vocab: dict[str, int] = model.get("vocab") or {}
    matched, added_normalized = _added_as_tokens(added, vocab)
    _check_byte_symbols(vocab)
    ranks: dict[bytes, int] = {bytes([b]): vocab[c] for b, c in bytes_to_unicode().items()}
    ranks.update(_merge_ranks(model.get("merges") or [], vocab))
    skipped = _add_vocab_tokens(ranks, vocab, {int(t["id"]) for t in added}, ignore_merges)
    rank_ids = set(ranks.values())
    if len(rank_ids) != len(ranks):
        raise NotConvertible("two byte strings share one id in the vocab")
    special = {tok["content"]: int(tok["id"]) for tok in added if int(tok["id"]) not in rank_ids}
    return Conversion(pat_str, ranks, special, ignore_merges, pattern_source, skipped, normalizer, matched,
                      added_normalized)


def _check_model(model: dict[str, Any]) -> None:
    """The model must be a deterministic byte-level BPE whose merges work on plain symbols."""
    if model.get("type") != "BPE":
        raise NotConvertible(f"model is {model.get('type')!r}, not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise NotConvertible(f"BPE dropout {model['dropout']} makes encoding random")
    if model.get("byte_fallback"):
        raise NotConvertible("BPE byte_fallback is set (a SentencePiece-style model, not byte-level)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotConvertible(f"BPE {key} {model[key]!r} changes the symbols merges work on")


def _added_as_tokens(added: list[dict[str, Any]], vocab: dict[str, int]) -> tuple[dict[str, int], bool]:
    """The added tokens that are not special (`tokenizers` matches them inside documents, before the split
    pattern: Qwen's <tool_call>, <think>) and whether they match the normalized text; special ones are text."""
    plain = [t for t in added if not t.get("special", False)]
    for tok in plain:
        known = vocab.get(tok.get("content"))
        if known is not None and known != tok.get("id"):
            raise NotConvertible(f"added token {tok.get('content')!r} (id {tok.get('id')}) is not special and is also "
                                 f"vocab token {known}: which id tokenizers gives it depends on its version")
        for option in ("single_word", "lstrip", "rstrip"):
            if tok.get(option):
                raise NotConvertible(f"added token {tok.get('content')!r} (id {tok.get('id')}) is not special and "
                                     f"has {option}: tokenizers matches it inside documents in a way tiktoken's "
                                     "engine does not reproduce")
    normalized = {bool(t.get("normalized", True)) for t in plain}
    if len(normalized) > 1:
        raise NotConvertible("the added tokens that are not special match partly the text, partly the normalized "
                             "text; tiktoken's engine matches all of them one way")
    return {t["content"]: int(t["id"]) for t in plain}, normalized == {True}


def _check_byte_symbols(vocab: dict[str, int]) -> None:
    missing = [b for b, c in bytes_to_unicode().items() if c not in vocab]
    if missing:
        raise NotConvertible(f"{len(missing)} of the 256 byte symbols are missing from the vocab "
                             f"(first: byte 0x{missing[0]:02x}); not a complete byte-level BPE")
    # With all 256 byte symbols in the vocab, an unk_token can never be emitted: every character the
    # ByteLevel pre-tokenizer produces is known. The probe's all-bytes text confirms it.


def _merge_ranks(merges: list[Any], vocab: dict[str, int]) -> dict[bytes, int]:
    """The bytes each merge makes -> its id, checking that ids rise with the merges (tiktoken's rank order)."""
    merged: dict[bytes, int] = {}
    prev_rank = -1
    for i, m in enumerate(merges):
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                raise NotConvertible(f"merge {i} {m!r} is not two symbols")
            a, b = parts
        else:
            a, b = m
        ab = a + b
        ra, rb, rab = vocab.get(a), vocab.get(b), vocab.get(ab)
        if ra is None or rb is None or rab is None:
            raise NotConvertible(f"merge {i} ({a!r}, {b!r}) uses or makes a token missing from the vocab")
        if not (rab > ra and rab > rb):
            raise NotConvertible(f"merges disagree with rank order at merge {i}: {a!r} + {b!r} -> id {rab} "
                                 f"is not above its parts' ids {ra}, {rb}")
        if rab < prev_rank:
            raise NotConvertible(f"merges disagree with rank order at merge {i}: {ab!r} has id {rab}, "
                                 f"below the previous merge's id {prev_rank}")
        prev_rank = rab
        bab = _symbols_to_bytes(ab)
        if bab is None:
            raise NotConvertible(f"merge {i} makes {ab!r}, which is not byte-level (outside GPT-2's byte table)")
        merged[bab] = rab
    return merged


def _add_vocab_tokens(ranks: dict[bytes, int], vocab: dict[str, int], added_ids: set[int],
                      ignore_merges: bool) -> list[str]:
    """Add to `ranks` the vocab tokens no merge makes but a whole piece may equal (`ignore_merges`);
    returns the tokens left out, each with why."""
    skipped: list[str] = []
    whole_only: list[tuple[str, bytes]] = []
    for token, tid in vocab.items():
        bt = _symbols_to_bytes(token)
        if bt is None:
            # Not made of byte symbols: BPE over byte symbols never produces it, nor can a whole
            # pre-tokenized piece equal it. Only the added-token path could, and that is off.
            skipped.append(f"{token!r} (id {tid}): not byte-level")
            continue
        if bt in ranks:
            continue
        if int(tid) in added_ids:
            continue  # a special token: encoded as text, never produced by BPE
        if not ignore_merges:
            skipped.append(f"{token!r} (id {tid}): no merge makes it")  # unreachable for tokenizers too
            continue
        whole_only.append((token, bt))
    ranks.update({bt: int(vocab[token]) for token, bt in whole_only})
    for token, bt in whole_only:
        # ignore_merges: tokenizers emits a vocab token when a whole piece equals it, as tiktoken does.
        # tiktoken would also merge two adjacent parts into it, which tokenizers never does without a
        # merge rule, so such a token must not be splittable into two ranked tokens.
        for k in range(1, len(bt)):
            if bt[:k] in ranks and bt[k:] in ranks:
                raise NotConvertible(f"vocab token {token!r} (id {vocab[token]}) has no merge rule but splits "
                                     f"into two ranked tokens; tiktoken would merge into it, tokenizers would not")
    return skipped


# Byte symbol -> the Latin-1 character of its byte; characters below 256 that are not byte symbols go
# to U+FFFF so that encoding to Latin-1 fails for them as for any other non-symbol.
_TO_LATIN1 = {ord(c): chr(b) for b, c in bytes_to_unicode().items()}
_TO_LATIN1.update({i: "\uffff" for i in range(256) if i not in _TO_LATIN1})


def _symbols_to_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token stands for; None when it is not made of byte symbols."""
    try:
        return token.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return None


def _normalization(norm: dict[str, Any] | None) -> str | None:
    """The Unicode normalization form the normalizer applies ("NFC", which Python's own reproduces), or None."""
    if norm is None:
        return None
    if norm.get("type") == "Sequence":
        forms = [f for f in map(_normalization, norm.get("normalizers") or []) if f]
        if len(forms) > 1:
            raise NotConvertible(f"normalizers {forms} one after another; tiktoken's engine applies at most one")
        return forms[0] if forms else None
    if norm.get("type") == "NFC":
        return "NFC"
    raise NotConvertible(f"normalizer {norm.get('type')} rewrites text before BPE; tiktoken has no normalizer")


def _byte_level_ok(p: dict[str, Any], where: str) -> None:
    if p.get("add_prefix_space", False):
        raise NotConvertible(f"{where} ByteLevel add_prefix_space=true adds a space tiktoken would not")


def _split_pattern(pre: dict[str, Any] | None) -> tuple[str, str]:
    """The single regex equivalent to the pre-tokenizer, and a description of where it came from."""
    if pre is None:
        raise NotConvertible("no pre-tokenizer: not a byte-level BPE")
    kind = pre.get("type")
    if kind == "ByteLevel":
        _byte_level_ok(pre, "pre-tokenizer")
        if not pre.get("use_regex", True):
            raise NotConvertible("ByteLevel use_regex=false does not split text; tiktoken would merge whole "
                                 "documents as one piece")
        return GPT2_PATTERN, "GPT-2 ByteLevel pattern"
    if kind == "Sequence":
        steps = pre.get("pretokenizers") or []
        shape = [s.get("type") for s in steps]
        if shape == ["ByteLevel"]:
            return _split_pattern(steps[0])
        if shape == ["Split", "ByteLevel"]:
            split, byte_level = steps
            _byte_level_ok(byte_level, "pre-tokenizer")
            if byte_level.get("use_regex", True):
                raise NotConvertible("Split followed by ByteLevel use_regex=true splits twice; tiktoken "
                                     "takes one regex")
            pattern = split.get("pattern") or {}
            if "Regex" not in pattern:
                raise NotConvertible(f"Split pattern {pattern!r} is not a regex")
            if split.get("behavior") != "Isolated" or split.get("invert", False):
                raise NotConvertible(f"Split behavior {split.get('behavior')!r} (invert={split.get('invert')}) "
                                     "differs from tiktoken's: each match its own piece")
            return pattern["Regex"], "the Split pre-tokenizer's regex"
        raise NotConvertible(f"pre-tokenizer Sequence {shape} is not [ByteLevel] or [Split, ByteLevel]")
    raise NotConvertible(f"pre-tokenizer {kind} is not ByteLevel (or Split + ByteLevel)")


def parse_tokenizer_json(data: bytes) -> dict[str, Any]:
    """The JSON object of a `tokenizer.json` (ValueError when it is not one)."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("top level is not an object")
    return obj


# --- the probe -------------------------------------------------------------------------------------

_UNICODE_SPACES = "\u0085\u00a0\u1680\u180e\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009" \
                  "\u200a\u200b\u2028\u2029\u202f\u205f\u3000\ufeff"


def probe_texts(extra: Sequence[str] = ()) -> list[str]:
    """Texts that exercise what could tell the two engines apart.

    Every code point 0-255 and at least one character per valid UTF-8 lead byte (so every byte value
    a valid UTF-8 text can hold), runs of spaces, tabs and newlines, Unicode spaces, digits of several
    scripts, contractions in both cases, non-Latin scripts, combining marks, emoji sequences, code, long
    runs of one character (merge order), and the `extra` strings (the tokenizer's special tokens).
    """
    latin1 = [chr(i) for i in range(256)]
    two_byte = "".join(chr(c) for c in range(0x80, 0x800))
    three_byte = "".join(chr(max(0x800, (lead - 0xE0) << 12) + 0x123) for lead in range(0xE0, 0xF0))
    four_byte = "".join(chr(min(0x10F600, 0x10000 + ((lead - 0xF0) << 18) + 0xF600)) for lead in range(0xF0, 0xF5))
    texts = [
        "".join(latin1),
        "".join(f"{c}x {c}{c}{c} a{c}\n" for c in latin1),
        two_byte, three_byte + " " + four_byte, " ".join(two_byte[::7]) + "\n" + three_byte + four_byte,
        "a  b   c    d\n\ne\n\n\nf\t\tg \t \n h\r\ni\r\n\r\nj   \n   k\n",
        "   leading spaces", "trailing spaces   ", "\n\n\nleading newlines", "trailing newlines\n\n\n", " ", "\n",
        "\t", "   ", " \n \n ", "\r\r\n\n\r", "x\u00a0\u00a0y\u3000\u3000z",
        "".join(f"a{s}b{s}{s}c {s}\n{s}" for s in _UNICODE_SPACES),
        "0 1 12 123 1234 12345 123456789012 3.14159 1,000,000 -42 +7 1e-9 0x1F 2024-01-31 12:30",
        "٠١٢٣٤٥٦٧٨٩ ۰۱۲ ०१२३ ๐๑๒ ０１２３ ²³¹ ½¾ Ⅻ ⑳ 𝟘𝟙",
        "I'm you're we've they'll he'd it's don't I'M YOU'RE WE'VE THEY'LL HE'D IT'S 's 'S ' s ''",
        "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the_quick-brown.fox?",
        "Съешь же ещё этих мягких французских булок, да выпей чаю. Ελληνικά κείμενα.",
        "中文文本，包含标点。日本語のテキスト、カタカナとひらがな。한국어 텍스트입니다.",
        "العربية نص مع أرقام ١٢٣ עברית טקסט हिन्दी पाठ ภาษาไทย ქართული Հայերեն",
        "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353a\u0334\u0335l\u0336g\u0337o",
        "a\u0301\u0323 a\u0323\u0301 \u212b \u2126 \u1100\u1161\u11a8 \u0344 \u0958 \u2adc \ufb1d \U0001d15e",
        "😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ ✌🏿 🏳️‍🌈 😀😀😀 a😀b",
        "def f(x):\n    return x ** 2  # square\n\tif a != b: pass\n{\"key\": [1, 2.5, null]}\n",
        "https://example.com/path?q=1&r=2 user@example.org C:\\Windows\\path <div class=\"x\">&amp;</div>",
        "a" * 64, "ab" * 40, " " * 70, "\n" * 33, "!" * 50, "=" * 80, "-" * 77, "." * 45, "0" * 41, "_" * 60,
        "aaaaa bbbbbbbbb cccccccccccccccc", "\u00e9" * 30, "中" * 25, "😀" * 12,
        "<|endoftext|> <s> </s> <|im_start|>user<|im_end|> <|begin_of_text|><pad>[CLS][SEP]<unk>",
    ]
    for s in extra:
        texts.append(s)
        texts.append(f"before{s}after {s} {s}{s}\n{s}")
    return texts


def vocab_texts(ranks: dict[bytes, int]) -> list[str]:
    """Every multi-byte token that is valid UTF-8, as text: tiktoken looks such a piece up whole."""
    out = []
    for b in ranks:
        if len(b) > 1:
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                pass
    return out


def first_mismatch(expected: Callable[[list[str]], list[list[int]]],
                   actual: Callable[[list[str]], list[Sequence[int]]],
                   texts: list[str], label: str, engine: str = "tiktoken") -> str | None:
    """Compare two encoders id for id; None when they agree, else where and how they differ."""
    if not texts:
        return None
    want = expected(texts)
    got = actual(texts)
    for n, (text, w, g) in enumerate(zip(texts, want, got)):
        g = list(g)
        if w == g:
            continue
        k = next((i for i, (x, y) in enumerate(zip(w, g)) if x != y), min(len(w), len(g)))
        return (f"{label} text {n} differs at token {k}: tokenizers {w[k:k + 4]}, {engine} {g[k:k + 4]} "
                f"(text {text[:60]!r}{'...' if len(text) > 60 else ''})")
    return None


def proof_cache_dir() -> str:
    """The folder where engine proofs are remembered on this machine: DATAFLOW_PROOF_CACHE, else `engine-proofs`
    in the machine's dataflow cache folder (`env.cache_dir`, which DATAFLOW_CACHE moves)."""
    return env.text("DATAFLOW_PROOF_CACHE") or os.path.join(env.cache_dir(), "engine-proofs")
