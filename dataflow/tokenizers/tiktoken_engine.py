"""tiktoken as an engine for a byte-level BPE `tokenizer.json`: converted (see `bpe_convert`), then proven.

Around tiktoken's split-and-merge, the engine does what `tokenizers` does first: it matches the added tokens that
are not special inside the text (Qwen's <tool_call>, <think>: their ids, and the text between them encoded apart)
and normalizes to NFC (Python's `unicodedata`) when the file's normalizer does; a text that holds neither goes
to tiktoken as it is. The proof compares tiktoken with `tokenizers` id for id on the probe text and on every
vocab token (unless ignore_merges makes whole-piece lookups identical by construction). Its outcome is kept per
file and process, and a success is remembered on this machine per file, conversion and library versions.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
import unicodedata
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa

from dataflow.formats.atomic import write_json_atomic
from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.bpe_convert import Conversion, NotConvertible
from dataflow.tokenizers.flat import Flat, Reference, flat_from_lists

if TYPE_CHECKING:
    import tiktoken


# bump when `convert` may derive other ranks, patterns or text rules: remembered ones are then unused
CONVERSION_VERSION = 2

# tokenizer.json sha256 -> (the proven conversion and its Encoding, what the proof covered) or (None, why not)
_PROVEN: dict[str, tuple["tuple[Conversion, tiktoken.Encoding] | None", str]] = {}


def tiktoken_lists(enc: "tiktoken.Encoding", texts: Sequence[str], threads: int) -> list[list[int]]:
    """tiktoken's ordinary encoding (special-token strings as text) of each text.

    One thread: `encode_ordinary` on the calling thread, as `encode_ordinary_batch(num_threads=1)`
    does minus its per-call thread pool and per-text hand-off (measurably slower). More threads:
    `encode_ordinary_batch`. Lone surrogates become U+FFFD inside tiktoken.
    """
    if threads == 1:
        encode = enc.encode_ordinary
        return [encode(t) for t in texts]
    return enc.encode_ordinary_batch(list(texts), num_threads=threads)


def encoding(name: str, pat_str: str, ranks: dict[bytes, int], specials: dict[str, int]) -> "tiktoken.Encoding":
    """A tiktoken Encoding; NotConvertible when tiktoken refuses it (mostly a regex it cannot compile)."""
    import tiktoken

    try:
        return tiktoken.Encoding(name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=specials)
    except Exception as e:
        raise NotConvertible(f"tiktoken rejects the conversion ({e})") from None


class TiktokenEngine:
    """A proven tiktoken Encoding behind the engine interface: flat ids of an Arrow batch, lists for checks; with
    the text rules of its conversion (`normalizer`, the non-special `added` tokens) applied around it."""

    name = "tiktoken"

    def __init__(self, enc: "tiktoken.Encoding", threads: int = 1, conv: Conversion | None = None) -> None:
        self.enc = enc
        self.threads = threads
        form = conv.normalizer if conv is not None else None
        self._normalize = functools.partial(unicodedata.normalize, form) if form else None
        self._added = dict(conv.added) if conv is not None else {}
        self._added_normalized = bool(conv and conv.added_normalized)
        # leftmost-longest, as tokenizers matches added tokens: at one position the longest alternative first
        self._split = re.compile("(" + "|".join(map(re.escape, sorted(self._added, key=len, reverse=True))) + ")") \
            if self._added else None

    def encode_flat(self, texts: pa.Array) -> Flat:
        return flat_from_lists(self._lists(texts.to_pylist(), self.threads))

    def lists(self, texts: list[str]) -> list[list[int]]:
        return self._lists(texts, 1)

    def _lists(self, texts: list[str], threads: int) -> list[list[int]]:
        normalize = self._normalize
        if normalize is not None and (self._split is None or self._added_normalized):
            texts, normalize = [normalize(t) for t in texts], None  # normalized before added tokens are matched
        if self._split is None:
            return tiktoken_lists(self.enc, texts, threads)
        holds = [self._split.search(t) is not None for t in texts]
        plain = [normalize(t) if normalize else t for t, h in zip(texts, holds) if not h]
        plain_ids = iter(tiktoken_lists(self.enc, plain, threads))
        return [self._with_added(t, normalize) if h else next(plain_ids) for t, h in zip(texts, holds)]

    def _with_added(self, text: str, normalize: Callable[[str], str] | None) -> list[int]:
        """The ids of a text holding added tokens: theirs, and the text between them encoded piece by piece."""
        ids: list[int] = []
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self._added[part])
            elif part:
                ids += self.enc.encode_ordinary(normalize(part) if normalize else part)
        return ids


def build(data: bytes, sha256: str, reference: Reference, threads: int = 1) -> tuple[TiktokenEngine, str]:
    """The proven engine and what its proof covered; NotConvertible saying why there is none."""
    if sha256 not in _PROVEN:
        try:
            _PROVEN[sha256] = _proven_before(sha256) or _build_and_prove(data, sha256, reference)
        except NotConvertible as e:
            _PROVEN[sha256] = (None, str(e))
    proven, text = _PROVEN[sha256]
    if proven is None:
        raise NotConvertible(text)
    conv, enc = proven
    return TiktokenEngine(enc, threads, conv), text


def _proven_before(sha256: str) -> tuple[tuple[Conversion, "tiktoken.Encoding"], str] | None:
    """The Encoding from a conversion remembered with an earlier proof of the same file on this machine."""
    recalled = recall_proof(sha256)
    if recalled is None:
        return None
    conv, proof = recalled
    enc = encoding(f"dataflow-{sha256[:12]}", conv.pat_str, conv.mergeable_ranks, conv.special_tokens)
    return (conv, enc), proof + " (proof cached on this machine)"


def _build_and_prove(data: bytes, sha256: str, reference: Reference) -> tuple[tuple[Conversion, "tiktoken.Encoding"],
                                                                               str]:
    """Convert, build the Encoding and compare it with tokenizers on the probe (and the vocab)."""
    try:
        obj = bpe_convert.parse_tokenizer_json(data)
    except ValueError as e:
        raise NotConvertible(f"cannot parse the JSON ({e})") from None
    conv = bpe_convert.convert(obj)
    enc = encoding(f"dataflow-{sha256[:12]}", conv.pat_str, conv.mergeable_ranks, conv.special_tokens)
    lists = TiktokenEngine(enc, 1, conv).lists
    specials = [t["content"] for t in obj.get("added_tokens") or []]
    probe = bpe_convert.probe_texts(specials)
    # Without ignore_merges, tokenizers runs BPE on a piece that is itself a token, where tiktoken
    # looks it up whole: the two agree on such pieces only if BPE rebuilds every token.
    vocab_texts = [] if conv.ignore_merges else bpe_convert.vocab_texts(conv.mergeable_ranks)
    why = (bpe_convert.first_mismatch(reference, lists, probe, "probe")
           or bpe_convert.first_mismatch(reference, lists, vocab_texts, "vocab token"))
    if why:
        raise NotConvertible(why)
    left_out = f"; {len(conv.skipped)} vocab tokens no merge can make left out" if conv.skipped else ""
    rules = ", ".join(([f"{conv.normalizer} normalization"] if conv.normalizer else [])
                      + ([f"{len(conv.added)} added tokens matched in text"] if conv.added else []))
    proof = (f"ranks and split pattern ({conv.pattern_source}) derived from tokenizer.json{left_out}"
             + (f", with {rules}" if rules else "") + f", equivalence proven on the probe ({len(probe)} texts)"
             + (f" + all {len(vocab_texts)} vocab tokens" if vocab_texts else ""))
    remember_proof(sha256, proof, conv)
    return (conv, enc), proof


# --- proofs remembered on this machine --------------------------------------------------------------

def _proof_path(sha256: str) -> str:
    """Where a proof is remembered: keyed by the file, the conversion and both engines' versions."""
    import tiktoken
    import tokenizers

    return os.path.join(bpe_convert.proof_cache_dir(), f"{sha256}-conv{CONVERSION_VERSION}-tiktoken"
                        f"{tiktoken.__version__}-tokenizers{tokenizers.__version__}.json")


def recall_proof(sha256: str) -> tuple[Conversion, str] | None:
    """The conversion an earlier run on this machine proved for this file with these versions, and its proof:
    loading the remembered ranks skips parsing the JSON and converting the vocabulary (most of a load)."""
    try:
        with open(_proof_path(sha256)) as f:
            d = json.load(f)
        ranks = {binascii.a2b_base64(token): rank for token, rank in d["ranks"]}
        conv = Conversion(d["pat_str"], ranks, d["special_tokens"], False, "", normalizer=d["normalizer"],
                          added=d["added"], added_normalized=d["added_normalized"])
        return conv, d["proof"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_proof(sha256: str, proof: str, conv: Conversion) -> None:
    """Best effort: a read-only home only means the next run converts and proves again."""
    try:
        path = _proof_path(sha256)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ranks = [[base64.b64encode(token).decode("ascii"), rank] for token, rank in conv.mergeable_ranks.items()]
        write_json_atomic(path, {"sha256": sha256, "proof": proof, "pat_str": conv.pat_str,
                                 "special_tokens": conv.special_tokens, "normalizer": conv.normalizer,
                                 "added": conv.added, "added_normalized": conv.added_normalized, "ranks": ranks})
    except OSError:
        pass
