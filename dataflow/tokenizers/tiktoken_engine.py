"""tiktoken as an engine for a byte-level BPE `tokenizer.json`: converted (see `bpe_convert`), then proven.

The proof compares tiktoken with `tokenizers` id for id on the probe text and on every vocab token
(unless ignore_merges makes whole-piece lookups identical by construction). Its outcome is kept per
file and process, and a success is remembered on this machine per file and library versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa

from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.bpe_convert import NotConvertible
from dataflow.tokenizers.flat import Flat, flat_from_lists

if TYPE_CHECKING:
    import tiktoken

Reference = Callable[[list[str]], list[list[int]]]

# tokenizer.json sha256 -> (tiktoken Encoding, what its proof covered) or (None, why there is none)
_PROVEN: dict[str, tuple["tiktoken.Encoding | None", str]] = {}


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
    """A proven tiktoken Encoding behind the engine interface: flat ids of an Arrow batch, lists for checks."""

    name = "tiktoken"

    def __init__(self, enc: "tiktoken.Encoding", threads: int = 1) -> None:
        self.enc = enc
        self.threads = threads

    def encode_flat(self, texts: pa.Array) -> Flat:
        return flat_from_lists(tiktoken_lists(self.enc, texts.to_pylist(), self.threads))

    def lists(self, texts: list[str]) -> list[list[int]]:
        return tiktoken_lists(self.enc, texts, 1)


def build(data: bytes, sha256: str, reference: Reference, threads: int = 1) -> tuple[TiktokenEngine, str]:
    """The proven engine and what its proof covered; NotConvertible saying why there is none."""
    if sha256 not in _PROVEN:
        try:
            _PROVEN[sha256] = _proven_before(sha256) or _build_and_prove(data, sha256, reference)
        except NotConvertible as e:
            _PROVEN[sha256] = (None, str(e))
    enc, text = _PROVEN[sha256]
    if enc is None:
        raise NotConvertible(text)
    return TiktokenEngine(enc, threads), text


def _proven_before(sha256: str) -> tuple["tiktoken.Encoding", str] | None:
    """The Encoding from ranks remembered with an earlier proof of the same file on this machine."""
    recalled = bpe_convert.recall_proof(sha256)
    if recalled is None:
        return None
    enc = encoding(f"dataflow-{sha256[:12]}", recalled.pat_str, recalled.mergeable_ranks, recalled.special_tokens)
    return enc, recalled.proof + " (proof cached on this machine)"


def _build_and_prove(data: bytes, sha256: str, reference: Reference) -> tuple["tiktoken.Encoding", str]:
    """Convert, build the Encoding and compare it with tokenizers on the probe (and the vocab)."""
    try:
        obj = bpe_convert.parse_tokenizer_json(data)
    except ValueError as e:
        raise NotConvertible(f"cannot parse the JSON ({e})") from None
    conv = bpe_convert.convert(obj)
    enc = encoding(f"dataflow-{sha256[:12]}", conv.pat_str, conv.mergeable_ranks, conv.special_tokens)
    lists = TiktokenEngine(enc).lists
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
    proof = (f"ranks and split pattern ({conv.pattern_source}) derived from tokenizer.json{left_out}, "
             f"equivalence proven on the probe ({len(probe)} texts)"
             + (f" + all {len(vocab_texts)} vocab tokens" if vocab_texts else ""))
    bpe_convert.remember_proof(sha256, proof, conv)
    return enc, proof
