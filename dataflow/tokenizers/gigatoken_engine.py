"""gigatoken as an engine for a `tokenizer.json`: byte-level BPE and SentencePiece-style BPE with byte fallback.

It is used only once proven to give the ids of `tokenizers` (special-token strings as text) on the probe
text and on every vocab token; the outcome is kept per file and process and remembered on this machine
per file and library versions. Special tokens are removed from the file gigatoken loads, so that
`<|endoftext|>` inside a document is encoded as text, as `tokenizers` does with encode_special_tokens.

gigatoken 0.10 caches the ids of every distinct piece it has seen, without bound (its issue #36): on
terabytes of text a worker would grow until the machine runs out of memory. The engine therefore drops
its tokenizer and loads a fresh one (~0.1 s) when the process has grown, since its first batches after a
start, by more than CACHE_BUDGET_BYTES (256 MB), or by more than HOSTILE_FLOOR_BYTES (40 MB) while
growing faster than HOSTILE_RATE bytes per byte of text. The second rule tells the two kinds of input
apart: on prose the cache pays for itself and its growth slows (measured on KJV text: +39 MB after 16 MB,
+47 MB after 57 MB, +105 MB after 200 MB), so it keeps its cache up to the hard budget; on text whose
pieces rarely repeat (numbers, ids, hashes) it grows 2-5 bytes per byte and buys nothing, so it starts
afresh early and memory stays flat (1M vs 10M such documents: 1.04x peak RSS).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
from typing import Any

import numpy as np
import pyarrow as pa

from dataflow import env
from dataflow.formats.atomic import atomic_open, write_json_atomic
from dataflow.memory import release_freed_memory
from dataflow.tokenizers import bpe_convert
from dataflow.tokenizers.bpe_convert import NotConvertible
from dataflow.tokenizers.flat import Flat, Reference, string_buffers

log = logging.getLogger(__name__)

# growth of the process (RSS) that makes the engine start afresh; DATAFLOW_GIGATOKEN_CACHE_MB overrides it
CACHE_BUDGET_BYTES = int(env.number("DATAFLOW_GIGATOKEN_CACHE_MB", 256, minimum=1)) << 20
# ... or this much growth at more than HOSTILE_RATE bytes per byte of text encoded: a cache that does not pay
HOSTILE_FLOOR_BYTES = min(40 << 20, CACHE_BUDGET_BYTES)
HOSTILE_RATE = 2.0
# growth counts from this batch after a start: the first ones allocate what every batch needs (a block's
# arrays, the shard writer's queue), which would read as a cache growing faster than the text
SETTLING_BATCHES = 2
CACHE_BUDGET_TEXT = 1 << 30  # text between fresh starts where the RSS cannot be read (not Linux)
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# tokenizer.json sha256 -> (engine, what its proof covered) or (None, why there is none)
_PROVEN: dict[str, tuple["GigatokenEngine | None", str]] = {}


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def engine_json(obj: dict[str, Any]) -> str:
    """The tokenizer.json gigatoken loads: special added tokens left out, so their text stays text."""
    obj = dict(obj)
    obj["added_tokens"] = [t for t in obj.get("added_tokens") or [] if not t.get("special", False)]
    return json.dumps(obj)


class GigatokenEngine:
    """gigatoken behind the engine interface, its memory bounded by fresh starts."""

    name = "gigatoken"

    def __init__(self, json_text: str, threads: int = 1) -> None:
        self.json_text = json_text
        self.parallel = threads > 1
        self.restarts = 0  # fresh starts for the memory bound, for tests and the log
        self._tok = None
        self._load()

    def _load(self) -> None:
        import gigatoken

        if self._tok is not None:  # free the old cache before the new tokenizer allocates, back to the OS
            self._tok = None
            release_freed_memory()
        try:
            self._tok = gigatoken.Tokenizer.from_json(self.json_text)
        except Exception as e:  # gigatoken raises ValueError/RuntimeError for what it does not support
            first_line = (str(e).strip().splitlines() or [""])[0]
            raise NotConvertible(f"gigatoken cannot load it ({type(e).__name__}: {first_line})") from None
        # growth counts from the SETTLING_BATCHES-th batch after a (fresh) start in this process
        self._base_rss, self._pid, self._batches, self._text_since = None, os.getpid(), 0, 0

    def encode_flat(self, texts: pa.Array) -> Flat:
        """Ids of every text of a string array (no nulls) as flat values + offsets, zero-copy both ways."""
        import awkward as ak

        if len(texts) == 0:
            return np.zeros(0, np.uint32), np.zeros(1, np.int64)
        offsets, data = string_buffers(texts)
        strings = ak.Array(ak.contents.ListOffsetArray(
            ak.index.Index64(offsets), ak.contents.NumpyArray(data, parameters={"__array__": "char"}),
            parameters={"__array__": "string"}))
        layout = ak.to_layout(self._tok.encode_batch(strings, parallel=self.parallel))
        out_offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        values = np.asarray(layout.content.data, dtype=np.uint32)[out_offsets[0]:out_offsets[-1]]
        self._bound(int(data.size))
        return values, out_offsets - out_offsets[0]

    def before_fork(self) -> None:
        """Import what encode_flat needs (awkward, ~0.13 s a process) now, once, for the worker processes about
        to fork from this one, which would each import it at their first batch; a process that only proves the
        engine (a coordinator of spawned workers, a finished run's rerun) never imports it."""
        import awkward  # noqa: F401

    def lists(self, texts: list[str]) -> list[list[int]]:
        return self._tok.encode_batch_list(texts, parallel=False)

    def _bound(self, text_bytes: int) -> None:
        """Start afresh when the process has grown past the budget, or fast and past the hostile floor (see
        the module docstring); where the RSS cannot be read, after CACHE_BUDGET_TEXT of text."""
        rss = _rss_bytes()
        if os.getpid() != self._pid:  # a forked worker's first batch: it counts from its own start
            self._pid, self._batches = os.getpid(), 0
        self._batches += 1
        if self._batches <= SETTLING_BATCHES:  # the buffers every batch needs are still being allocated
            self._base_rss, self._text_since = rss, 0
            return
        self._text_since += text_bytes
        if rss is None or self._base_rss is None:
            grown = self._text_since > CACHE_BUDGET_TEXT
        else:
            growth = rss - self._base_rss
            grown = growth > CACHE_BUDGET_BYTES or (growth > HOSTILE_FLOOR_BYTES
                                                    and growth > HOSTILE_RATE * self._text_since)
        if grown:
            self.restarts += 1
            log.info("gigatoken: a fresh engine after %d MB of text (memory bound)", self._text_since >> 20)
            self._load()


def vocab_texts(obj: dict[str, Any]) -> list[str]:
    """Every vocab token of the model as text (multi-character ones): more inputs for the proof."""
    model = obj.get("model") or {}
    vocab = model.get("vocab") or {}
    if not isinstance(vocab, dict):
        return []
    if model.get("byte_fallback"):  # SentencePiece-style: U+2581 stands for a space, <0xNN> for a byte
        return [t.replace("\u2581", " ") for t in vocab if len(t) > 1 and not _BYTE_TOKEN.fullmatch(t)]
    inverse = {c: b for b, c in bpe_convert.bytes_to_unicode().items()}
    out = []
    for token in vocab:
        if len(token) > 1 and all(c in inverse for c in token):
            try:
                out.append(bytes(inverse[c] for c in token).decode("utf-8"))
            except UnicodeDecodeError:
                pass
    return out


def _proof_path(sha256: str) -> str:
    import gigatoken
    import tokenizers

    version = getattr(gigatoken, "__version__", None) or _dist_version("gigatoken")
    return os.path.join(bpe_convert.proof_cache_dir(),
                        f"{sha256}-gigatoken{version}-tokenizers{tokenizers.__version__}.json")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def build(data: bytes, sha256: str, reference: Reference, threads: int = 1) -> tuple[GigatokenEngine, str]:
    """The proven engine and what its proof covered; NotConvertible saying why there is none."""
    if sha256 not in _PROVEN:
        try:
            _PROVEN[sha256] = _build_and_prove(data, sha256, reference, threads)
        except NotConvertible as e:
            _PROVEN[sha256] = (None, str(e))
    engine, text = _PROVEN[sha256]
    if engine is None:
        raise NotConvertible(text)
    engine.parallel = threads > 1
    return engine, text


def _build_and_prove(data: bytes, sha256: str, reference: Reference, threads: int) -> tuple[GigatokenEngine, str]:
    try:
        import gigatoken  # noqa: F401
    except ImportError:
        raise NotConvertible("gigatoken is not installed (pip install gigatoken)") from None
    if importlib.util.find_spec("awkward") is None:  # imported at the first batch (or before_fork): ~0.13 s
        raise NotConvertible("awkward, which gigatoken returns its ids in, is not installed (pip install awkward)")
    remembered = _recall(sha256)
    if remembered is not None and not remembered.get("ok"):
        raise NotConvertible(remembered["text"] + " (remembered on this machine)")
    cached_json = _recall_engine_json(sha256, remembered) if remembered is not None else None
    if cached_json is not None:  # proven before: not even the JSON needs parsing again
        return GigatokenEngine(cached_json, threads), remembered["text"] + " (proof cached on this machine)"
    try:
        obj = bpe_convert.parse_tokenizer_json(data)
    except ValueError as e:
        raise NotConvertible(f"cannot parse the JSON ({e})") from None
    engine = GigatokenEngine(engine_json(obj), threads)
    if remembered is not None:
        _remember(sha256, True, remembered["text"], engine.json_text)
        return engine, remembered["text"] + " (proof cached on this machine)"
    specials = [t["content"] for t in obj.get("added_tokens") or []]
    probe = bpe_convert.probe_texts(specials)
    vocab = vocab_texts(obj)
    why = (bpe_convert.first_mismatch(reference, engine.lists, probe, "probe", "gigatoken")
           or bpe_convert.first_mismatch(reference, engine.lists, vocab, "vocab token", "gigatoken"))
    if why:
        _remember(sha256, False, why)
        raise NotConvertible(why)
    kind = "SentencePiece-style BPE with byte fallback" if (obj.get("model") or {}).get("byte_fallback") \
        else "byte-level BPE"
    proof = f"{kind}, equivalence proven on the probe ({len(probe)} texts) + all {len(vocab)} vocab tokens"
    _remember(sha256, True, proof, engine.json_text)
    return engine, proof


def _recall(sha256: str) -> dict[str, Any] | None:
    try:
        with open(_proof_path(sha256)) as f:
            d = json.load(f)
        return d if isinstance(d.get("ok"), bool) and isinstance(d.get("text"), str) else None
    except (OSError, ValueError, AttributeError):
        return None


def _engine_json_path(sha256: str) -> str:
    """Where the JSON gigatoken loads is kept, beside its proof."""
    return _proof_path(sha256)[:-len(".json")] + ".engine.json"


def _recall_engine_json(sha256: str, remembered: dict[str, Any]) -> str | None:
    """The engine's tokenizer.json saved with a proof, if it is there and whole."""
    try:
        with open(_engine_json_path(sha256), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != remembered.get("engine_sha256"):
        return None
    return data.decode("utf-8")


def _remember(sha256: str, ok: bool, text: str, json_text: str | None = None) -> None:
    """Best effort: a read-only home only means the next run proves again (or parses the JSON again)."""
    try:
        path = _proof_path(sha256)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        record: dict[str, Any] = {"sha256": sha256, "ok": ok, "text": text}
        if json_text is not None:
            data = json_text.encode("utf-8")
            with atomic_open(_engine_json_path(sha256)) as f:
                f.write(data)
            record["engine_sha256"] = hashlib.sha256(data).hexdigest()
        write_json_atomic(path, record)
    except OSError:
        pass
