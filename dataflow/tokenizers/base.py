"""The Tokenizer interface every kind implements, and the built-in `bytes` tokenizer.

A tokenizer turns Arrow string arrays into flat ids (`encode_flat(texts) -> (values, offsets)`, flat.py) and
ids back into text (`decode`); `meta` is what the manifest records of it. `encode_flat` encodes special-token
strings inside a text as ordinary text and adds no BOS/EOS; `encode_docs(texts, "parse")` gives those strings
their ids instead. Framing a document (BOS, EOS) is the caller's: `template` says how the tokenizer's own
post-processor frames one sequence, `config_tokens` what its config names BOS and EOS.
"""

from __future__ import annotations

import abc
import os
import shutil
from typing import Sequence

import fsspec
import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.formats.manifest import Framing, TokenizerMeta
from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.flat import Flat, arrow_texts, flat_from_lists, replace_documents, split_flat, string_buffers

Template = tuple[tuple[int, ...], tuple[int, ...]]  # the ids a post-processor puts before and after one sequence


class Tokenizer(abc.ABC):
    """A loaded tokenizer: its manifest metadata, the file it came from, and encode/decode."""

    meta: TokenizerMeta
    source: str | None = None  # the tokenizer file (local path or URL); None for `bytes`
    engine: str = "bytes"  # "bytes" | "hf" | "gigatoken" | "tiktoken": what encodes
    engine_reason: str = ""  # why that engine, for the log
    threads: int = 1  # engine threads per encode_batch call
    template: Template = ((), ())  # how the tokenizer's post-processor frames a single sequence (none: nothing)
    config_tokens: dict[str, str] = {}  # "bos_token"/"eos_token" as the tokenizer's config names them
    framing: Framing | None = None  # set by a caller that frames documents with this tokenizer (tokenize)

    @abc.abstractmethod
    def encode_flat(self, texts: pa.Array) -> Flat:
        """Token ids of every text of a string array without nulls, as flat uint32 values + int64 offsets;
        special-token strings treated as plain text, no EOS added."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, one array each (the per-document form of encode_flat)."""
        return split_flat(self.encode_flat(arrow_texts(texts)))

    def encode_docs(self, texts: pa.Array, special_tokens: str = "text") -> Flat:
        """`encode_flat` under a special-token rule: "text" (special-token strings encoded as the text they are)
        or "parse" (each becomes its id, as the tokenizer's own library gives it). Only the documents that hold
        such a string (one regex pass over the batch finds them) are encoded again, by `_encode_parsed`."""
        flat = self.encode_flat(texts)
        pattern = self._special_pattern() if special_tokens == "parse" else None
        if pattern is None or not len(texts):
            return flat
        import pyarrow.compute as pc  # here: a run without the rule never imports it (~0.05 s)

        rows = np.flatnonzero(arrays_true(pc.match_substring_regex(texts, pattern)))
        if not rows.size:
            return flat
        parsed = flat_from_lists(self._encode_parsed(texts.take(pa.array(rows)).to_pylist()))
        return self._in_vocabulary(replace_documents(flat, rows, parsed))

    def special_strings(self) -> list[str]:
        """The special tokens' strings, which the "parse" rule turns into their ids (none: the rule changes
        nothing)."""
        return []

    def _encode_parsed(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text with its special-token strings as their ids (see encode_docs): a tokenizer whose
        `special_strings()` names any must say how."""
        raise NotImplementedError(f"{type(self).__name__} names special tokens but cannot encode them as ids")

    def _special_pattern(self) -> str | None:
        """An RE2 pattern matching any special-token string (each quoted literally), or None when there is none."""
        if not hasattr(self, "_pattern"):
            quoted = [r"\Q" + s + r"\E" if r"\E" not in s else "".join(f"\\x{{{ord(c):x}}}" for c in s)
                      for s in self.special_strings() if s]
            self._pattern = "|".join(quoted) or None
        return self._pattern

    def token_id(self, token: str) -> int | None:
        """The id of `token` (a vocabulary or special token's string), or None when the tokenizer has none."""
        return None

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids, EOS dropped."""

    def decode_all(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of every id, special tokens (EOS too) as their strings: a framed document with its framing ids
        cut off decodes to its text."""
        return self.decode(ids)

    def check_sample(self, sample: Sequence[str]) -> None:
        """Compare the engine with the tokenizer's own ids on input text (only a proven fast engine has
        anything to compare)."""

    def share_check_with_forks(self) -> None:
        """Forks of this process rely on its `check_sample` (only a proven fast engine checks anything)."""

    def _in_vocabulary(self, flat: Flat) -> Flat:
        """`flat`, its ids checked to lie below the vocabulary size: that size chose the token dtype of the
        dataset, so a larger id would be stored modulo 2^16 (one numpy max per batch; none where the ids' own
        dtype cannot hold such an id)."""
        values = flat[0]
        if values.size and np.iinfo(values.dtype).max >= self.meta.vocab_size:
            top = int(values.max())
            if top >= self.meta.vocab_size:
                raise ConfigError(f"{self.source}: the tokenizer gave id {top}, not below its vocabulary size "
                                  f"{self.meta.vocab_size} ({self.meta.dtype} tokens), so it is not stored (modulo the "
                                  "dtype); the tokenizer file, or what this machine remembers of it in "
                                  f"{bpe_convert.proof_cache_dir()}, is inconsistent: delete that folder and run again")
        return flat

    def copy_into(self, out_dir: str) -> TokenizerMeta:
        """Copy the tokenizer file into the dataset folder so readers need nothing else."""
        if self.source is None:
            return self.meta
        name = "tokenizer.json" if self.meta.kind == "hf" else "tokenizer.tiktoken"
        with fsspec.open(self.source, "rb") as src, open(os.path.join(out_dir, name), "wb") as dst:
            shutil.copyfileobj(src, dst)
        self.meta.file = name
        return self.meta


def arrays_true(mask: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(mask.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids; decode(encode(text)) is the exact text."""

    def __init__(self) -> None:
        self.meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
        self.engine_reason = "bytes: the built-in UTF-8 byte tokenizer"

    def encode_flat(self, texts: pa.Array) -> Flat:
        offsets, data = string_buffers(texts)
        return data, offsets  # uint8: the ids are the bytes themselves

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")
