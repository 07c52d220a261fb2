"""Tokenizers behind one small interface: `encode_flat(arrow_texts) -> (values, offsets)`, `decode(ids)`.

`bytes` is built in (UTF-8 bytes as ids 0-255, EOS 256). A Hugging Face `tokenizer.json` gives the ids
the `tokenizers` library gives; the fastest engine proven to give the same ids runs it: gigatoken
(byte-level BPE, SentencePiece-style BPE with byte fallback), then tiktoken (byte-level BPE without a
normalizer), then `tokenizers` itself. `tiktoken:PATH` loads a `.tiktoken` BPE file as its encoding (a published
one by its sha256, another with the split pattern of --tiktoken-pattern: tiktoken_files.py).
Special-token strings inside a document are always encoded as ordinary text: a document never
injects an EOS. Lone surrogates (invalid Unicode) are encoded as U+FFFD by every engine.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import logging
import os
import shutil
import threading
from typing import Any, Iterator, Sequence

import fsspec
import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import TokenizerMeta
from dataflow.tokenizers import bpe_convert, hf_reference, tiktoken_files
from dataflow.tokenizers.bpe_convert import NotConvertible
from dataflow.tokenizers.flat import Flat, arrow_texts, flat_from_lists, scrub, split_flat, string_buffers

log = logging.getLogger(__name__)

ENGINES = ("auto", "hf", "gigatoken", "tiktoken")
FAST_ENGINES = ("gigatoken", "tiktoken")  # the order --engine auto tries them in
# Input text each process compares against `tokenizers` before it trusts a fast engine alone (~0.1 s).
SAMPLE_CHARS = 1 << 17
SPEC_FORMS = ("bytes", "a path or URL to a Hugging Face tokenizer.json", "tiktoken:PATH (a .tiktoken BPE file)")


_ENV_LOCK = threading.Lock()
_LOAD_LOCK = threading.Lock()  # one load of a reference at a time (decode may be called from several threads)


@contextlib.contextmanager
def _sequential_tokenizers() -> Iterator[None]:
    """`tokenizers` batch calls on the calling thread only, for the duration of the block.

    The library reads TOKENIZERS_PARALLELISM at every batch call; setting it for the call alone keeps
    one engine thread without changing the process for other users, and never starts rayon's pool
    (whose threads a forked worker would inherit broken).
    """
    with _ENV_LOCK:
        old = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            yield
        finally:
            if old is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = old


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


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json`: ids are those of `tokenizers` with `encode_special_tokens=True`.

    With engine "auto" the fastest engine proven to give the same ids encodes: gigatoken, then tiktoken
    (see their modules for the proofs), each also compared on `sample` and on the first SAMPLE_CHARS
    of text this object encodes; a difference, or a feature an engine cannot reproduce, moves on to the
    next one and says why in `engine_reason`, down to `tokenizers` itself. Engine "gigatoken" or
    "tiktoken" turns those reasons into a ConfigError; "hf" skips the proofs.
    `tokenizers` itself (the reference) loads when first needed when this machine remembers both the proof
    and the metadata (hf_reference.py): a run's workers then start before it loads.
    """

    def __init__(self, source: str, data: bytes, engine: str = "auto", threads: int = 1,
                 sample: Sequence[str] = ()) -> None:
        self.source = source
        self.threads = threads
        self._requested = engine
        self._data = data  # kept for the reference, and for a new choice should the input sample refuse the engine
        self._sha256 = hashlib.sha256(data).hexdigest()
        self._hf = None  # `tokenizers` itself: see _reference_tokenizer
        self._forks_checked_by: int | None = None  # see share_check_with_forks
        self.meta = hf_reference.recall_meta(source, self._sha256) if engine != "hf" else None
        self._ids_checked = self.meta is not None  # see hf_reference.check_ids: before any engine sees the file
        if self.meta is None:
            self._reference_tokenizer()  # sets the metadata
        if threads > 1:  # rayon sizes its pool once per process, at its first parallel call
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        self._fast = None  # the proven engine (gigatoken or tiktoken) when one runs
        self._sample_left = 0
        self.engine, self.engine_reason = "hf", "hf: chosen with --engine hf"
        if engine != "hf":
            self._choose_engine(data, [scrub(t) for t in sample])
        if self._fast is None:
            self._reference_tokenizer()  # it encodes: loaded now (forked workers inherit it)

    def _reference_tokenizer(self) -> Any:
        """`tokenizers` for this file, loaded at its first use. The metadata it gives replaces (with a warning) a
        remembered one that differs: the caller compares `meta` before and after the input check."""
        with _LOAD_LOCK:
            if self._hf is None:
                hf = hf_reference.load_reference(self.source, self._data, self._ids_checked)
                meta = hf_reference.meta_of(hf, self.source, self._sha256)
                known = None if self.meta is None else (self.meta.vocab_size, self.meta.eos_id)
                if known != (meta.vocab_size, meta.eos_id):
                    if known is not None:
                        log.warning("%s: the vocabulary size and EOS remembered on this machine were wrong %s; "
                                    "using %d, %d", self.source, known, meta.vocab_size, meta.eos_id)
                    self.meta = meta
                    hf_reference.remember_meta(meta)
                self._hf = hf
        return self._hf

    def share_check_with_forks(self) -> None:
        """Forks of this process from now on run this very engine, which this process compares with `tokenizers`
        on the input (`check_sample`, and whoever started them stops them should it differ): they do not check
        their own first SAMPLE_CHARS again, so they never load `tokenizers` (about 0.3 s a process)."""
        self._forks_checked_by = os.getpid()

    # --- engine choice ---------------------------------------------------------------------------

    def _choose_engine(self, data: bytes, sample: list[str]) -> None:
        order = FAST_ENGINES if self._requested == "auto" else (self._requested,)
        refused = []
        for name in order:
            try:
                fast, proof = _BUILDERS[name]().build(data, self._sha256, self._reference, self.threads)
                why = bpe_convert.first_mismatch(self._reference, fast.lists, sample, "input sample", name)
                if why:
                    raise NotConvertible(why)
            except NotConvertible as e:
                if self._requested == name:
                    raise ConfigError(f"{self.source}: --engine {name} cannot give this tokenizer's ids: {e}") \
                        from None
                refused.append(f"{name}: {e}")
                continue
            # the sample is input text checked in this process: it counts toward the per-process check
            self._fast, self.engine = fast, name
            self._sample_left = max(0, SAMPLE_CHARS - sum(map(len, sample)))
            self._proof, self._refused = proof, refused
            self.engine_reason = self._fast_reason(len(sample))
            log.info("%s: %s", self.source, self.engine_reason)
            return
        self.engine_reason = "hf: " + "; ".join(refused)
        log.info("%s: tokenizers encodes (%s)", self.source, self.engine_reason)

    def check_sample(self, sample: Sequence[str]) -> None:
        """Compare the engine chosen with `tokenizers` on `sample` too (input text, checked after the load so
        that forked workers can start with this engine meanwhile); on a difference choose again, `sample`
        included. An engine asked for by name that differs is a ConfigError. The metadata is checked too: `meta`
        may change here (see _reference_tokenizer)."""
        self._reference_tokenizer()
        if self._fast is None or not sample:
            return
        sample = [scrub(t) for t in sample]
        why = bpe_convert.first_mismatch(self._reference, self._fast.lists, sample, "input sample", self.engine)
        if why is None:
            self._sample_left = max(0, self._sample_left - sum(map(len, sample)))
            self.engine_reason = self._fast_reason(len(sample))
            return
        self._fast, self.engine = None, "hf"
        self._choose_engine(self._data, sample)

    def _fast_reason(self, sample_texts: int) -> str:
        """Why the fast engine runs: its proof, the input sample it was compared on, the engines refused."""
        return (f"{self.engine}: {self._proof}" + (f" + {sample_texts} sample texts" if sample_texts else "")
                + f"; each process that loads it also checks its first {SAMPLE_CHARS} characters"
                + (f" (not {'; '.join(self._refused)})" if self._refused else ""))

    def _check_sample(self, texts: pa.Array, flat: Flat) -> Flat:
        """Compare the first SAMPLE_CHARS characters this process encodes; on a difference, use tokenizers."""
        values, offsets = flat
        checked, results = [], []
        for i, text in enumerate(texts[:min(len(texts), 4096)].to_pylist()):
            if self._sample_left <= 0:
                break
            ids = values[offsets[i]:offsets[i + 1]].tolist()
            if len(text) > self._sample_left:
                text = text[:self._sample_left]
                ids = self._fast.lists([text])[0]
            self._sample_left -= len(text)
            checked.append(text)
            results.append(ids)
        why = bpe_convert.first_mismatch(self._reference, lambda _: results, checked, "input", self.engine)
        if why is None:
            return flat
        if self._requested == self.engine:
            raise ConfigError(f"{self.source}: --engine {self.engine} gives other ids than tokenizers: {why}")
        log.warning("%s: %s and tokenizers disagree (%s); tokenizers encodes from here on", self.source,
                    self.engine, why)
        self._fast, self.engine, self.engine_reason = None, "hf", f"hf: {why}"
        return self.encode_flat(texts)

    # --- encode / decode -------------------------------------------------------------------------

    def encode_flat(self, texts: pa.Array) -> Flat:
        if self._fast is None:
            return self._in_vocabulary(flat_from_lists(self._hf_lists(texts.to_pylist(), self.threads)))
        flat = self._fast.encode_flat(texts)
        if self._sample_left > 0 and self._forks_checked_by in (None, os.getpid()):
            flat = self._check_sample(texts, flat)
        return self._in_vocabulary(flat)

    def _reference(self, texts: list[str]) -> list[list[int]]:
        """The ids the proofs compare against, on this thread: checks never start rayon's pool."""
        return self._hf_lists(texts, 1)

    def _hf_lists(self, texts: list[str], threads: int) -> list[list[int]]:
        try:
            if threads == 1:
                with _sequential_tokenizers():
                    encs = self._reference_tokenizer().encode_batch(texts, add_special_tokens=False)
            else:  # parallel unless TOKENIZERS_PARALLELISM says otherwise (as after a fork)
                encs = self._reference_tokenizer().encode_batch(texts, add_special_tokens=False)
        except TypeError:  # a lone surrogate: not a Rust string
            return self._hf_lists([scrub(t) for t in texts], threads)
        return [e.ids for e in encs]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return self._reference_tokenizer().decode(arr[arr != self.meta.eos_id].tolist(), skip_special_tokens=False)


def _gigatoken():
    from dataflow.tokenizers import gigatoken_engine

    return gigatoken_engine


def _tiktoken():
    from dataflow.tokenizers import tiktoken_engine

    return tiktoken_engine


_BUILDERS = {"gigatoken": _gigatoken, "tiktoken": _tiktoken}


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
        return self._engine.enc.decode(arr[arr != self.meta.eos_id].tolist())


def load_tokenizer(spec: str, engine: str = "auto", *, threads: int = 1, sample: Sequence[str] = (),
                   decode_only: bool = False) -> Tokenizer:
    """`bytes`, a path/URL to a `tokenizer.json`, or `tiktoken:PATH` (with a split pattern: see
    tiktoken_files.tiktoken_spec).

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
    spec, pattern = tiktoken_files.split_spec(spec)
    kind = "tiktoken" if spec.startswith("tiktoken:") else "hf"
    source = spec[len("tiktoken:"):] if kind == "tiktoken" else spec
    if kind == "tiktoken" and engine == "hf":
        raise ConfigError(f"{source}: a .tiktoken file runs only on tiktoken; --engine hf needs a tokenizer.json")
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
