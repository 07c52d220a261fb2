"""A Hugging Face `tokenizer.json` as a Tokenizer: the ids of `tokenizers` (special-token strings as text),
encoded by the engine chosen for it (choose.py) and by that engine alone."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from dataclasses import replace
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.formats.manifest import TokenizerMeta
from dataflow.tokenizers import bpe_convert, choose, hf_reference
from dataflow.tokenizers.base import Tokenizer
from dataflow.tokenizers.choose import SAMPLE_CHARS, Choice
from dataflow.tokenizers.flat import Flat, flat_from_lists, scrub
from dataflow.tokenizers.hub import HubFile

log = logging.getLogger(__name__)

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


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json`: ids are those of `tokenizers` with `encode_special_tokens=True`.

    The engine is chosen when it loads (`choose.choose`: the fastest proven one, on `sample` too, or `tokenizers`
    itself) and may be chosen again on more input text until the tokenizer first gives ids: `check_sample` (the
    run's input sample, compared after the load so that forked workers start meanwhile) and the first batch
    this process encodes (its first SAMPLE_CHARS characters, compared before any of its ids leave). After that
    the engine never changes: a difference found on the rest of those characters is a ConfigError.
    `tokenizers` itself (the reference) loads when first needed when this machine remembers both the proof
    and the metadata (hf_reference.py): a run's workers then start before it loads.
    `origin`: the Hub repository and commit the file is of (`--tokenizer ORG/NAME`), which `meta` records.
    """

    def __init__(self, source: str, data: bytes, engine: str = "auto", threads: int = 1,
                 sample: Sequence[str] = (), origin: HubFile | None = None) -> None:
        self.source = source
        self.origin = origin
        self.threads = threads
        self._requested = engine
        self._data = data  # kept for the reference, and for a new choice should the input sample refuse the engine
        self._sha256 = hashlib.sha256(data).hexdigest()
        self._hf = None  # `tokenizers` itself: see _reference_tokenizer
        self._hf_parse = None  # `tokenizers` with special-token strings parsed (the "parse" rule), when needed
        self._specials: list[str] | None = None
        self._forks_checked_by: int | None = None  # see share_check_with_forks
        self._gave_ids = False  # the engine is final once True
        recalled = hf_reference.recall_meta(source, self._sha256)  # with --engine hf (decode too) the reference
        # loads below and compares it; a file remembered has passed check_ids, which it then skips (~0.08 s)
        self.meta, self.template = recalled or (None, ((), ()))
        self.meta = self._provenance(self.meta)
        self.config_tokens = hf_reference.config_tokens(source)
        self._ids_checked = self.meta is not None  # see hf_reference.check_ids: before any engine sees the file
        if self.meta is None:
            self._reference_tokenizer()  # sets the metadata
        if threads > 1:  # rayon sizes its pool once per process, at its first parallel call
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        sample = [scrub(t) for t in sample]
        self._use(choose.choose(source, data, self._sha256, engine, sample, self._reference, threads), sample)
        if self._fast is None:
            self._reference_tokenizer()  # it encodes: loaded now (forked workers inherit it)

    def _use(self, choice: Choice, sample: Sequence[str] | None = None) -> None:
        """Take `choice` as the engine (never once this tokenizer has given ids: the engine does not change);
        a new choice made on `sample` (input text) counts it toward this process's check."""
        if self._gave_ids and choice.engine != self.engine:
            raise AssertionError("the engine of a tokenizer that has given ids never changes")
        self._choice = choice
        self._fast, self.engine, self.engine_reason = choice.fast, choice.engine, choice.reason
        if sample is not None:
            self._sample_left = max(0, SAMPLE_CHARS - sum(map(len, sample))) if self._fast is not None else 0

    def _reference_tokenizer(self) -> Any:
        """`tokenizers` for this file, loaded at its first use. The metadata it gives replaces (with a warning) a
        remembered one that differs: the caller compares `meta` before and after the input check."""
        with _LOAD_LOCK:
            if self._hf is None:
                hf = hf_reference.load_reference(self.source, self._data, self._ids_checked)
                meta = self._provenance(hf_reference.meta_of(hf, self.source, self._sha256))
                template = hf_reference.template_of(hf)
                known = None if self.meta is None else (self.meta.vocab_size, self.meta.eos_id, self.template)
                if known != (meta.vocab_size, meta.eos_id, template):
                    if known is not None:
                        log.warning("%s: the vocabulary size and EOS remembered on this machine were wrong %s; "
                                    "using %d, %d%s", self.source, known[:2], meta.vocab_size, meta.eos_id,
                                    "" if known[2] == template else f" (its template: {template}, not {known[2]})")
                    self.meta, self.template = meta, template
                    hf_reference.remember_meta(meta, template)
                self._hf = hf
        return self._hf

    def _provenance(self, meta: TokenizerMeta | None) -> TokenizerMeta | None:
        """`meta` naming the Hub repository and commit the file is of, when it is of one (`origin`)."""
        if meta is None or self.origin is None:
            return meta
        return replace(meta, name=self.origin.repo, repo=self.origin.repo, revision=self.origin.revision)

    def share_check_with_forks(self) -> None:
        """Forks of this process from now on run this very engine, which this process compares with `tokenizers`
        on the input (`check_sample`, and whoever started them stops them should it differ): they do not check
        their own first SAMPLE_CHARS again, so they never load `tokenizers` (about 0.3 s a process); and they
        inherit what the engine imports for its batches (`before_fork`)."""
        self._forks_checked_by = os.getpid()
        before_fork = getattr(self._fast, "before_fork", None)
        if before_fork is not None:
            before_fork()

    # --- the input checks ------------------------------------------------------------------------

    def check_sample(self, sample: Sequence[str]) -> None:
        """Compare the engine chosen with `tokenizers` on `sample` too (input text, checked after the load so
        that forked workers can start with this engine meanwhile); on a difference choose again, `sample`
        included. An engine asked for by name that differs is a ConfigError, and so is any difference once this
        tokenizer has given ids. The metadata is checked too: `meta` may change here (see _reference_tokenizer)."""
        self._reference_tokenizer()
        if self._fast is None or not sample:
            return
        sample = [scrub(t) for t in sample]
        why = bpe_convert.first_mismatch(self._reference, self._fast.lists, sample, "input sample", self.engine)
        if why is None:
            self._sample_left = max(0, self._sample_left - sum(map(len, sample)))
            self._use(self._choice.sampled(len(sample)))
            return
        if self._gave_ids:
            raise self._differs(why)
        self._use(choose.choose(self.source, self._data, self._sha256, self._requested, sample, self._reference,
                                self.threads), sample)

    def _check_sample(self, texts: pa.Array, flat: Flat) -> Flat:
        """Compare this process's first SAMPLE_CHARS characters with `tokenizers` before their ids leave. On a
        difference in the first batch (no id given yet), `tokenizers` encodes from the start; after, it is a
        ConfigError (the engine does not change in the middle of the work), as is any for an engine named."""
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
        if self._requested == self.engine or self._gave_ids:
            raise self._differs(why)
        log.warning("%s: %s and tokenizers disagree (%s); tokenizers encodes from the start", self.source,
                    self.engine, why)
        self._use(Choice("hf", None, f"hf: {why}", refused=self._choice.refused + (f"{self.engine}: {why}",)), [])
        return self.encode_flat(texts)

    def _differs(self, why: str) -> ConfigError:
        if self._requested == self.engine:
            return ConfigError(f"{self.source}: --engine {self.engine} gives other ids than tokenizers: {why}")
        return ConfigError(f"{self.source}: {self.engine}, chosen for this tokenizer and used since, gives other ids "
                           f"than tokenizers on input ({why}); the engine does not change during the work: run "
                           "again with --engine hf")

    # --- encode / decode -------------------------------------------------------------------------

    def encode_flat(self, texts: pa.Array) -> Flat:
        if self._fast is None:
            flat = flat_from_lists(self._hf_lists(texts.to_pylist(), self.threads))
        else:
            flat = self._fast.encode_flat(texts)
            if self._sample_left > 0 and self._forks_checked_by in (None, os.getpid()):
                flat = self._check_sample(texts, flat)
        flat = self._in_vocabulary(flat)
        self._gave_ids = True
        return flat

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

    def special_strings(self) -> list[str]:
        """The strings of the file's special added tokens (those `encode_special_tokens` governs)."""
        if self._specials is None:
            self._specials = hf_reference.special_strings(self._data)
        return self._specials

    def _encode_parsed(self, texts: list[str]) -> list[list[int]]:
        with _LOAD_LOCK:
            if self._hf_parse is None:
                self._hf_parse = hf_reference.load_reference(self.source, self._data, True)
                self._hf_parse.encode_special_tokens = False  # "<|endoftext|>" in a document is its id
        with _sequential_tokenizers():
            return [e.ids for e in self._hf_parse.encode_batch([scrub(t) for t in texts], add_special_tokens=False)]

    def token_id(self, token: str) -> int | None:
        return self._reference_tokenizer().token_to_id(token)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return self.decode_all(arr[arr != self.meta.eos_id])

    def decode_all(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._reference_tokenizer().decode(np.asarray(ids).tolist(), skip_special_tokens=False)
