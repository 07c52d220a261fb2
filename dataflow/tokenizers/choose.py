"""The engine choice for a `tokenizer.json`: which engine encodes it and why, decided before any text is encoded.

`choose` tries the engines --engine allows, in order (auto: gigatoken, then tiktoken). Each is proven by its own
module against `tokenizers` (the reference, hf_reference.py) on the probe text and the vocabulary, then compared
on the input sample the caller has; the first that holds is the `Choice`. When none holds, `tokenizers` itself
encodes (auto), or the engine asked for by name is a ConfigError saying why; `--engine hf` proves nothing.
The choice is the tokenizer's engine for good once that tokenizer has given ids (see HFTokenizer): later
comparisons with the reference can stop the work, never change the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.bpe_convert import NotConvertible
from dataflow.tokenizers.flat import Flat, Reference

log = logging.getLogger(__name__)

ENGINES = ("auto", "hf", "gigatoken", "tiktoken")
FAST_ENGINES = ("gigatoken", "tiktoken")  # the order --engine auto tries them in
# Input text each process compares against `tokenizers` before it trusts a fast engine alone (~0.1 s).
SAMPLE_CHARS = 1 << 17



class FastEngine(Protocol):
    """What a proven engine offers (GigatokenEngine, TiktokenEngine): flat ids of a batch, lists for checks."""

    name: str

    def encode_flat(self, texts: pa.Array) -> Flat: ...

    def lists(self, texts: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class Choice:
    """The engine that encodes, the proven engine object (None: `tokenizers` itself), and why."""

    engine: str  # "gigatoken" | "tiktoken" | "hf"
    fast: FastEngine | None
    reason: str  # for the log and the run's summary
    proof: str = ""  # what the fast engine's proof covered
    refused: tuple[str, ...] = ()  # the engines tried before it, each with why not

    def sampled(self, sample_texts: int) -> "Choice":
        """The same choice, its reason saying it was also compared on `sample_texts` input texts."""
        if self.fast is None:
            return self
        return replace(self, reason=_fast_reason(self.engine, self.proof, self.refused, sample_texts))


def choose(source: str, data: bytes, sha256: str, requested: str, sample: Sequence[str], reference: Reference,
           threads: int = 1) -> Choice:
    """The engine for the tokenizer.json `data` (at `source`) under --engine `requested`, compared with
    `reference` on `sample` (input text, lone surrogates already replaced). Logs the outcome once."""
    if requested == "hf":
        return Choice("hf", None, "hf: chosen with --engine hf")
    order = FAST_ENGINES if requested == "auto" else (requested,)
    refused: list[str] = []
    for name in order:
        try:
            fast, proof = _BUILDERS[name]().build(data, sha256, reference, threads)
            why = bpe_convert.first_mismatch(reference, fast.lists, list(sample), "input sample", name)
            if why:
                raise NotConvertible(why)
        except NotConvertible as e:
            if requested == name:
                raise ConfigError(f"{source}: --engine {name} cannot give this tokenizer's ids: {e}") from None
            refused.append(f"{name}: {e}")
            continue
        choice = Choice(name, fast, "", proof, tuple(refused)).sampled(len(sample))
        log.info("%s: %s", source, choice.reason)
        return choice
    choice = Choice("hf", None, "hf: " + "; ".join(refused), refused=tuple(refused))
    log.info("%s: tokenizers encodes (%s)", source, choice.reason)
    return choice


def _fast_reason(engine: str, proof: str, refused: Sequence[str], sample_texts: int) -> str:
    """Why the fast engine runs: its proof, the input sample it was compared on, the engines refused."""
    return (f"{engine}: {proof}" + (f" + {sample_texts} sample texts" if sample_texts else "")
            + f"; each process that loads it also checks its first {SAMPLE_CHARS} characters"
            + (f" (not {'; '.join(refused)})" if refused else ""))


def _gigatoken():
    from dataflow.tokenizers import gigatoken_engine

    return gigatoken_engine


def _tiktoken():
    from dataflow.tokenizers import tiktoken_engine

    return tiktoken_engine


_BUILDERS = {"gigatoken": _gigatoken, "tiktoken": _tiktoken}
