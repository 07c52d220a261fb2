"""The Tokenizer interface every kind implements, and the built-in `bytes` tokenizer.

A tokenizer turns Arrow string arrays into flat ids (`encode_flat(texts) -> (values, offsets)`, flat.py) and
ids back into text (`decode`); `meta` is what the manifest records of it. Special-token strings inside a text are
encoded as ordinary text and no EOS is added: framing a document is the caller's.
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
from dataflow.formats.manifest import TokenizerMeta
from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.flat import Flat, arrow_texts, split_flat, string_buffers


class Tokenizer(abc.ABC):
    """A loaded tokenizer: its manifest metadata, the file it came from, and encode/decode."""

    meta: TokenizerMeta
    source: str | None = None  # the tokenizer file (local path or URL); None for `bytes`
    engine: str = "bytes"  # "bytes" | "hf" | "gigatoken" | "tiktoken": what encodes
    engine_reason: str = ""  # why that engine, for the log
    threads: int = 1  # engine threads per encode_batch call

    @abc.abstractmethod
    def encode_flat(self, texts: pa.Array) -> Flat:
        """Token ids of every text of a string array without nulls, as flat uint32 values + int64 offsets;
        special-token strings treated as plain text, no EOS added."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, one array each (the per-document form of encode_flat)."""
        return split_flat(self.encode_flat(arrow_texts(texts)))

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids, EOS dropped."""

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
