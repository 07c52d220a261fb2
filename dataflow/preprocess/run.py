"""`dataflow tokenize`: inputs -> work units -> worker processes -> ordered commit -> shards.

Workers tokenize units in any order; the main process commits their results strictly in unit order
into `ShardWriter`s, so shard boundaries and bytes depend only on the data, never on the number of
workers or on timing. Ids, the validation split and error counting happen at commit time, in input
order, for the same reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

import dataflow
from dataflow.errors import ConfigError, InputError
from dataflow.formats.manifest import MANIFEST_NAME, read_manifest
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, ShardWriter, parse_size
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES, Unit, plan_units
from dataflow.preprocess.sources import expand_inputs, read_unit
from dataflow.preprocess.tokenizers import Tokenizer, load_tokenizer

ENCODE_BATCH_CHARS = 1 << 20  # texts handed to the engine at once


@dataclass
class TokenizeConfig:
    inputs: list[str]
    out: str
    tokenizer: str = "bytes"
    engine: str = "auto"
    text_field: str = "text"
    id_field: str = "id"
    format: str = "arrow"
    compression: str = "zstd"
    zstd_level: int | None = None
    shard_size: int | str = DEFAULT_SHARD_SIZE
    workers: int = 0  # 0: one per CPU
    seed: int = 0
    val_fraction: float = 0.0
    eos: bool = True
    max_errors: int = 100
    unit_bytes: int = DEFAULT_UNIT_BYTES
    overwrite: bool = False
    progress: bool = True

    def output_settings(self) -> dict[str, Any]:
        """Everything that changes the output bytes; a rerun must match these to resume."""
        d = asdict(self)
        for k in ("out", "workers", "overwrite", "progress"):
            d.pop(k)
        d["shard_size"] = parse_size(self.shard_size)
        return d


@dataclass
class UnitResult:
    """A tokenized unit: documents as one token array cut by `lengths` (cheap to send between processes)."""

    index: int
    records: int
    text_bytes: int
    tokens: np.ndarray
    lengths: np.ndarray
    positions: list[int]  # record index (within the unit) of each document
    ids: list[str | None]
    errors: list[tuple[int, str | None, str]] = field(default_factory=list)  # (record index, id, reason)


@dataclass
class Summary:
    out: str
    datasets: dict[str, dict[str, int]]
    documents: int
    tokens: int
    text_bytes: int
    errors: int
    seconds: float
    tokenizer: str
    engine: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mb_per_s"] = round(self.text_bytes / 1e6 / max(self.seconds, 1e-9), 2)
        d["tokens_per_s"] = round(self.tokens / max(self.seconds, 1e-9))
        return d


# --- worker side -------------------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(spec: str, engine: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(spec, engine)


def tokenize_unit(unit: Unit, text_field: str, id_field: str, eos_id: int | None,
                  tokenizer: Tokenizer | None = None) -> UnitResult:
    """Read and tokenize one unit (runs in a worker process)."""
    tok = tokenizer or _WORKER_TOKENIZER
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    positions: list[int] = []
    ids: list[str | None] = []
    errors: list[tuple[int, str | None, str]] = []
    pending: list[str] = []
    pending_chars = 0
    records = text_bytes = 0
    eos = np.array([eos_id], dtype=np.uint32) if eos_id is not None else None

    def encode_pending() -> None:
        for ids_ in tok.encode_batch(pending):
            pieces.append(ids_)
            n = len(ids_)
            if eos is not None:
                pieces.append(eos)
                n += 1
            lengths.append(n)
        pending.clear()

    for rec in read_unit(unit, text_field, id_field):
        records += 1
        if rec.text is None:
            errors.append((rec.index, rec.id, rec.error or "bad record"))
            continue
        pending.append(rec.text)
        positions.append(rec.index)
        ids.append(rec.id)
        pending_chars += len(rec.text)
        text_bytes += len(rec.text)
        if pending_chars >= ENCODE_BATCH_CHARS:
            encode_pending()
            pending_chars = 0
    encode_pending()
    tokens = np.concatenate(pieces).astype(np.uint32, copy=False) if pieces else np.zeros(0, np.uint32)
    return UnitResult(unit.index, records, text_bytes, tokens, np.asarray(lengths, dtype=np.int64),
                      positions, ids, errors)


# --- main side ---------------------------------------------------------------------------------

def _results_in_order(units: list[Unit], cfg: TokenizeConfig, tok: Tokenizer, workers: int,
                      eos_id: int | None) -> Iterator[UnitResult]:
    """Tokenize units on `workers` processes; yield results in unit order with a bounded window."""
    if workers <= 1:
        for u in units:
            yield tokenize_unit(u, cfg.text_field, cfg.id_field, eos_id, tok)
        return
    window = 2 * workers
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(cfg.tokenizer, cfg.engine)) as pool:
        pending: deque[Future] = deque()
        todo = iter(units)
        for u in todo:
            pending.append(pool.submit(tokenize_unit, u, cfg.text_field, cfg.id_field, eos_id))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(tokenize_unit, nxt, cfg.text_field, cfg.id_field, eos_id))
            yield result


def in_val_split(doc_id: str, seed: int, fraction: float) -> bool:
    """Deterministic per-document split: a hash of (seed, id) mapped to [0, 1)."""
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64 < fraction


def _display_names(files: list[str]) -> dict[str, str]:
    """Input names relative to their common folder: stable ids that survive moving the corpus."""
    if len(files) == 1:
        return {files[0]: os.path.basename(files[0])}
    root = os.path.commonpath([f.split("://")[-1] for f in files])
    return {f: os.path.relpath(f.split("://")[-1], root) for f in files}


def _prepare_out(cfg: TokenizeConfig) -> None:
    index = os.path.join(cfg.out, MANIFEST_NAME)
    split_index = os.path.join(cfg.out, "train", MANIFEST_NAME)
    existing = index if os.path.exists(index) else split_index if os.path.exists(split_index) else None
    if existing and not cfg.overwrite:
        previous = read_manifest(existing).provenance.get("settings")
        if previous != json.loads(json.dumps(cfg.output_settings())):
            changed = sorted(k for k in cfg.output_settings() if (previous or {}).get(k) != cfg.output_settings()[k])
            raise ConfigError(f"{cfg.out} already holds a dataset made with other settings "
                              f"({', '.join(changed) or 'unknown'}); pass --overwrite to replace it")
    if os.path.isdir(cfg.out):
        for name in os.listdir(cfg.out):
            if name.startswith("shard-") or name in ("train", "val", "_errors.jsonl", MANIFEST_NAME,
                                                     "tokenizer.json", "tokenizer.tiktoken"):
                path = os.path.join(cfg.out, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(cfg.out, exist_ok=True)


def tokenize(cfg: TokenizeConfig) -> Summary:
    """Run a whole tokenize job and return its summary."""
    if not 0 <= cfg.val_fraction < 1:
        raise ConfigError(f"--val-fraction must lie in [0, 1), got {cfg.val_fraction}")
    started = time.perf_counter()
    files = expand_inputs(cfg.inputs)
    tok = load_tokenizer(cfg.tokenizer, cfg.engine)
    units = plan_units(files, cfg.unit_bytes)
    _prepare_out(cfg)
    workers = cfg.workers or os.cpu_count() or 1
    names = _display_names(files)
    provenance = {"inputs": files, "settings": cfg.output_settings(), "dataflow": dataflow.__version__,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    splits = {"train": cfg.out} if cfg.val_fraction <= 0 else \
        {"train": os.path.join(cfg.out, "train"), "val": os.path.join(cfg.out, "val")}
    writers = {}
    for split, path in splits.items():
        os.makedirs(path, exist_ok=True)
        meta = tok.copy_into(path)
        writers[split] = ShardWriter(path, tokenizer_meta=meta, format=cfg.format, compression=cfg.compression,
                                     shard_size=cfg.shard_size, zstd_level=cfg.zstd_level, provenance=provenance)
    eos_id = tok.meta.eos_id if cfg.eos else None
    errors_path = os.path.join(cfg.out, "_errors.jsonl")
    n_errors = n_docs = n_tokens = text_bytes = 0
    records_before = 0
    current_file = None
    bar = tqdm(total=sum(u.size for u in units), unit="B", unit_scale=True, desc="tokenize",
               disable=not cfg.progress, dynamic_ncols=True)
    with open(errors_path, "w") as errlog:
        for result in _results_in_order(units, cfg, tok, workers, eos_id):
            unit = units[result.index]
            if unit.file != current_file:
                current_file, records_before = unit.file, 0
            name = names[unit.file]
            for rec_index, doc_id, reason in result.errors:
                n_errors += 1
                where = _where(unit, records_before + rec_index)
                errlog.write(json.dumps({"file": unit.file, **where, "id": doc_id, "reason": reason}) + "\n")
                if n_errors > cfg.max_errors:
                    errlog.flush()
                    raise InputError(f"{unit.file} {_where_text(where)}: {reason} — {n_errors} bad records, more "
                                     f"than --max-errors {cfg.max_errors}; see {errors_path}")
            ends = np.cumsum(result.lengths)
            for k, (pos, doc_id) in enumerate(zip(result.positions, result.ids)):
                if doc_id is None:
                    doc_id = _default_id(unit, name, records_before + pos)
                split = "val" if in_val_split(doc_id, cfg.seed, cfg.val_fraction) else "train"
                writers[split].write(result.tokens[ends[k] - result.lengths[k]:ends[k]], id=doc_id)
            records_before += result.records
            n_docs += len(result.ids)
            n_tokens += int(result.tokens.size)
            text_bytes += result.text_bytes
            bar.update(unit.size)
            bar.set_postfix(docs=n_docs, tokens=n_tokens, refresh=False)
    bar.close()
    datasets = {}
    for split, w in writers.items():
        m = w.close()
        datasets[split] = {"documents": m.documents, "tokens": m.tokens, "shards": len(m.shards), "bytes": m.bytes}
    return Summary(cfg.out, datasets, n_docs, n_tokens, text_bytes, n_errors, time.perf_counter() - started,
                   tok.meta.name, tok.engine)


def _where(unit: Unit, record: int) -> dict[str, Any]:
    if unit.kind == "jsonl":
        return {"line": record + 1}
    if unit.kind == "parquet":
        return {"row": record}
    return {"file_document": record}


def _where_text(where: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in where.items())


def _default_id(unit: Unit, name: str, record: int) -> str:
    if unit.kind == "text":
        return name
    return f"{name}:{record + 1 if unit.kind == 'jsonl' else record}"
