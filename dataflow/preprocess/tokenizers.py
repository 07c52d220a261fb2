"""Tokenizers behind one small interface: `encode_batch(texts) -> list[np.ndarray]`, `decode(ids)`.

`bytes` is built in (UTF-8 bytes as ids 0-255, EOS 256). A Hugging Face `tokenizer.json` runs through
the `tokenizers` library; `tiktoken:PATH` loads a `.tiktoken` BPE file. Special-token strings inside a
document are always encoded as ordinary text: a document never injects an EOS.
"""

from __future__ import annotations

import abc
import base64
import hashlib
import os
import shutil
from typing import Sequence

import fsspec
import numpy as np

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import TokenizerMeta


class Tokenizer(abc.ABC):
    """A loaded tokenizer: its manifest metadata, the file it came from, and encode/decode."""

    meta: TokenizerMeta
    source: str | None = None  # the tokenizer file (local path or URL); None for `bytes`
    engine: str = "bytes"

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, special-token strings treated as plain text, no EOS added."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids, EOS dropped."""

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

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json`, batch-encoded by the `tokenizers` library."""

    def __init__(self, source: str, data: bytes):
        from tokenizers import Tokenizer as _HF

        try:
            self._tok = _HF.from_str(data.decode("utf-8"))
        except Exception as e:  # the library raises plain Exception for malformed files
            raise ConfigError(f"{source}: not a valid Hugging Face tokenizer.json ({e})") from None
        self._tok.no_truncation()
        self._tok.no_padding()
        try:
            self._tok.encode_special_tokens = True  # "<|endoftext|>" in a document is plain text
        except AttributeError:
            pass
        self.source = source
        self.engine = "hf"
        eos = _find_eos(self._tok)
        self.meta = TokenizerMeta(kind="hf", name=os.path.basename(source.rstrip("/")),
                                  vocab_size=self._tok.get_vocab_size(with_added_tokens=True), eos_id=eos,
                                  sha256=hashlib.sha256(data).hexdigest())

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = [int(i) for i in ids if int(i) != self.meta.eos_id]
        return self._tok.decode(ids, skip_special_tokens=False)


def _find_eos(tok) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    for name in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]"):
        if name in vocab:
            return int(vocab[name])
    raise ConfigError("the tokenizer has no end-of-text token (<|endoftext|>, </s>, ...); "
                      "pass --no-eos or use a tokenizer that defines one")


class TiktokenTokenizer(Tokenizer):
    """A `.tiktoken` BPE file (base64 token, rank per line) with GPT-2's split pattern."""

    GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, source: str, data: bytes):
        import tiktoken

        try:
            ranks = {base64.b64decode(tok): int(rank)
                     for tok, rank in (line.split() for line in data.decode().splitlines() if line)}
        except ValueError as e:
            raise ConfigError(f"{source}: not a valid .tiktoken file ({e})") from None
        eos = len(ranks)
        self._enc = tiktoken.Encoding(name=os.path.basename(source), pat_str=self.GPT2_PATTERN,
                                      mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eos})
        self.source = source
        self.engine = "tiktoken"
        self.meta = TokenizerMeta(kind="tiktoken", name=os.path.basename(source), vocab_size=eos + 1,
                                  eos_id=eos, sha256=hashlib.sha256(data).hexdigest())

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint32) for ids in self._enc.encode_ordinary_batch(list(texts))]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._enc.decode([int(i) for i in ids if int(i) != self.meta.eos_id])


def load_tokenizer(spec: str, engine: str = "auto") -> Tokenizer:
    """`bytes`, a path/URL to a `tokenizer.json`, or `tiktoken:PATH`."""
    if engine not in ("auto", "hf", "tiktoken"):
        raise ConfigError(f"unknown engine {engine!r}; choose auto, hf or tiktoken")
    if spec == "bytes":
        return ByteTokenizer()
    kind = "tiktoken" if spec.startswith("tiktoken:") else "hf"
    source = spec[len("tiktoken:"):] if kind == "tiktoken" else spec
    try:
        with fsspec.open(source, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(f"tokenizer file not found: {source}") from None
    if kind == "tiktoken":
        return TiktokenTokenizer(source, data)
    return HFTokenizer(source, data)


def tokenizer_for_dataset(dataset_dir: str, meta: TokenizerMeta) -> Tokenizer:
    """The tokenizer a dataset was written with, from the copy inside its folder."""
    if meta.kind == "bytes":
        return ByteTokenizer()
    if not meta.file:
        raise FormatError(f"{dataset_dir}: the manifest names no tokenizer file copy; cannot decode")
    path = os.path.join(dataset_dir, meta.file)
    return load_tokenizer(("tiktoken:" + path) if meta.kind == "tiktoken" else path, engine="hf")
