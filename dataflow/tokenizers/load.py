"""`load_tokenizer`: a --tokenizer spec to a loaded Tokenizer, the package's door; and `.tiktoken` files.

`bytes` is built in (UTF-8 bytes as ids 0-255, EOS 256; base.py). A Hugging Face `tokenizer.json` gives the
ids the `tokenizers` library gives (hf_tokenizer.py); the fastest engine proven to give the same ids runs it,
chosen once when it loads (choose.py): gigatoken (byte-level BPE, SentencePiece-style BPE with byte fallback),
then tiktoken (byte-level BPE without a normalizer), then `tokenizers` itself. `tiktoken:PATH` loads a
`.tiktoken` BPE file as its encoding (a published one by its sha256, another with the split pattern of
--tiktoken-pattern: tiktoken_files.py).
Special-token strings inside a document are always encoded as ordinary text: a document never
injects an EOS. Lone surrogates (invalid Unicode) are encoded as U+FFFD by every engine.
"""

from __future__ import annotations

import os
from typing import Sequence

import fsspec
import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import TokenizerMeta
from dataflow.tokenizers import hub, tiktoken_files, tiktoken_names
from dataflow.tokenizers.base import ByteTokenizer, Tokenizer
from dataflow.tokenizers.choose import ENGINES, FAST_ENGINES, SAMPLE_CHARS
from dataflow.tokenizers.flat import Flat
from dataflow.tokenizers.hf_tokenizer import HFTokenizer

__all__ = ["ByteTokenizer", "ENGINES", "FAST_ENGINES", "HFTokenizer", "SAMPLE_CHARS", "SPEC_FORMS", "TiktokenTokenizer",
           "Tokenizer", "load_tokenizer", "tokenizer_for_dataset"]

SPEC_FORMS = ("bytes", "a path or URL to a Hugging Face tokenizer.json",
              "ORG/NAME[@REVISION] or hf:ORG/NAME[@REVISION] (a Hugging Face Hub repository's tokenizer.json)",
              "tiktoken:PATH (a .tiktoken BPE file)")


class TiktokenTokenizer(Tokenizer):
    """A `.tiktoken` BPE file read as its encoding (see tiktoken_files.py): a published one, known by its sha256,
    with its encoding's split pattern, special tokens and EOS; another with the split pattern `pattern`."""

    def __init__(self, source: str, data: bytes, threads: int = 1, pattern: str | None = None,
                 decode_only: bool = False) -> None:
        from dataflow.tokenizers.tiktoken_engine import TiktokenEngine

        self._file = tiktoken_files.read(source, data, pattern, decode_only=decode_only)
        self._engine = TiktokenEngine(tiktoken_files.tiktoken_encoding(self._file, user_pattern=pattern), threads)
        self.source = source
        self.threads = threads
        self.engine = "tiktoken"
        self.engine_reason = f"tiktoken: {self._file.how}"
        self.meta = TokenizerMeta(kind="tiktoken", name=self._file.name, vocab_size=self._file.vocab_size,
                                  eos_id=self._file.eos_id, sha256=self._file.sha256)

    def encode_flat(self, texts: pa.Array) -> Flat:
        if not self._file.encodes:
            raise ConfigError(f"{self.source}: loaded to decode only; its split pattern is not known")
        return self._in_vocabulary(self._engine.encode_flat(texts))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return self.decode_all(arr[arr != self.meta.eos_id])

    def decode_all(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._engine.enc.decode(np.asarray(ids).tolist())

    def special_strings(self) -> list[str]:
        return list(self._file.special_tokens)

    def _encode_parsed(self, texts: list[str]) -> list[list[int]]:
        return [self._engine.enc.encode(t, allowed_special="all") for t in texts]

    def token_id(self, token: str) -> int | None:
        try:
            return self._engine.enc.encode_single_token(token)
        except KeyError:
            return None


def load_tokenizer(spec: str, engine: str = "auto", *, threads: int = 1, sample: Sequence[str] = (),
                   decode_only: bool = False) -> Tokenizer:
    """`bytes`, a path/URL to a `tokenizer.json`, `ORG/NAME[@REVISION]` or `hf:ORG/NAME[@REVISION]` (a Hub
    repository's tokenizer.json, from huggingface_hub's cache: hub.py), `tiktoken:PATH` (with a split pattern: see
    tiktoken_files.tiktoken_spec) or `tiktoken:NAME`, an OpenAI encoding from tiktoken's cache (tiktoken_names.py).

    `engine` ("auto", "hf", "gigatoken", "tiktoken") picks what encodes a `tokenizer.json`; see HFTokenizer.
    `threads` is the number of engine threads per encode_batch call (one per worker process by default).
    `sample` is input text added to the equivalence proof of the auto/tiktoken engine.
    `decode_only`: the caller needs the metadata and `decode` only, so a `.tiktoken` file needs no split pattern.
    """
    if engine not in ENGINES + ("bytes",):
        raise ConfigError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)}")
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"tokenizer threads must be a positive integer, got {threads!r}")
    if spec == "bytes":
        if engine not in ("auto", "bytes"):
            raise ConfigError(f"--engine {engine} applies to tokenizer.json files; the bytes tokenizer has no engine")
        return ByteTokenizer()
    if engine == "bytes":
        raise ConfigError(f"engine 'bytes' applies only to the bytes tokenizer, not {spec}")
    named = hub.parse(spec)
    if named is not None:
        found = hub.resolve(*named)
        return HFTokenizer(found.path, _read_tokenizer_file(spec, found.path), engine=engine, threads=threads,
                           sample=sample, origin=found)
    spec, pattern = tiktoken_files.split_spec(spec)
    kind = "tiktoken" if spec.startswith("tiktoken:") else "hf"
    source = spec[len("tiktoken:"):] if kind == "tiktoken" else spec
    if kind == "tiktoken" and engine == "hf":
        raise ConfigError(f"{source}: a .tiktoken file runs only on tiktoken; --engine hf needs a tokenizer.json")
    if kind == "tiktoken" and tiktoken_names.is_name(source):
        source, data = tiktoken_names.named_file(source)  # the file in tiktoken's cache
    elif kind == "tiktoken" and not any(c in source for c in "/\\.") and not os.path.exists(source):
        raise ConfigError(f"--tokenizer {spec}: no such file, and not one of tiktoken's encodings "
                          f"({', '.join(tiktoken_names.NAMES)}); pass tiktoken:NAME or tiktoken:PATH")
    else:
        data = _read_tokenizer_file(spec, source)
    if kind == "tiktoken":
        return TiktokenTokenizer(source, data, threads=threads, pattern=pattern, decode_only=decode_only)
    return HFTokenizer(source, data, engine=engine, threads=threads, sample=sample)


def _read_tokenizer_file(spec: str, source: str) -> bytes:
    """The bytes of the file a --tokenizer SPEC names; a ConfigError of one line saying what to pass instead."""
    forms = "; --tokenizer accepts " + ", ".join(SPEC_FORMS)
    try:
        with fsspec.open(source, "rb") as f:
            return f.read()
    except FileNotFoundError:
        if not any(c in spec for c in "/\\.:"):  # a bare name such as `gpt2`: no file, no URL
            raise ConfigError(f"--tokenizer {spec}: not `bytes` and not a file{forms}") from None
        raise ConfigError(f"tokenizer file not found: {source}{forms}") from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a folder; pass the tokenizer.json (or tiktoken:FILE) inside it") from None
    except (OSError, ValueError) as e:  # permissions, an unknown URL protocol, a failed download
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"--tokenizer {spec}: cannot read {source} ({type(e).__name__}: {first_line}){forms}") \
            from None


def tokenizer_for_dataset(dataset_dir: str, meta: TokenizerMeta) -> Tokenizer:
    """The tokenizer a dataset was written with, from the copy inside its folder (for decoding)."""
    if meta.kind == "bytes":
        return ByteTokenizer()
    if not meta.file:
        raise FormatError(f"{dataset_dir}: the manifest names no tokenizer file copy; cannot decode")
    path = os.path.join(dataset_dir, meta.file)
    if meta.kind == "tiktoken":
        return load_tokenizer("tiktoken:" + path, engine="tiktoken", decode_only=True)
    return load_tokenizer(path, engine="hf")  # decoding always runs on tokenizers: no proof needed
