"""The worker side of `dataflow tokenize`: one work unit -> a stream of tokenized record batches.

A unit's output is an Arrow record-batch stream with one row per input record, in input order:
`position` (record index in the unit), `id` (null when the input has none), `tokens` (null for a bad
record) and `error` (why a record is bad). Workers write it to a local file that the main process
reads back batch by batch, so neither side holds a whole unit in memory, however large the unit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from dataflow.preprocess.plan import Unit
from dataflow.preprocess.sources import read_unit
from dataflow.preprocess.tokenizers import Tokenizer, load_tokenizer

ENCODE_BATCH_CHARS = 1 << 20  # text handed to the engine at once; also the size of one output batch


@dataclass(frozen=True)
class UnitSpec:
    """What every unit needs to know, shipped once to each worker."""

    tokenizer: str
    engine: str
    text_field: str
    id_field: str
    eos_id: int | None
    dtype: str


@dataclass
class UnitStats:
    index: int
    records: int
    text_bytes: int


def unit_schema(dtype: str) -> pa.Schema:
    value = pa.uint16() if dtype == "uint16" else pa.uint32()
    return pa.schema([("position", pa.int64()), ("id", pa.string()), ("tokens", pa.list_(value)),
                      ("error", pa.string())])


_TOKENIZERS: dict[tuple[str, str], Tokenizer] = {}


def worker_tokenizer(tokenizer: str, engine: str) -> Tokenizer:
    """The tokenizer of this process, loaded once per (tokenizer spec, engine)."""
    key = (tokenizer, engine)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(tokenizer, engine)
    return _TOKENIZERS[key]


def tokenize_unit_batches(unit: Unit, spec: UnitSpec, stats: UnitStats) -> Iterator[pa.RecordBatch]:
    """Read and tokenize one unit; yields record batches of about ENCODE_BATCH_CHARS of text."""
    tok = worker_tokenizer(spec.tokenizer, spec.engine)
    schema = unit_schema(spec.dtype)
    rows: list = []  # (position, id, text or None, error or None)
    chars = 0
    for rec in read_unit(unit, spec.text_field, spec.id_field):
        stats.records += 1
        rows.append((rec.index, rec.id, rec.text, rec.error))
        if rec.text is not None:
            chars += len(rec.text)
            stats.text_bytes += len(rec.text)
        if chars >= ENCODE_BATCH_CHARS:
            yield _encode_rows(rows, tok, spec, schema)
            rows, chars = [], 0
    if rows or stats.records == 0:
        yield _encode_rows(rows, tok, spec, schema)


def _encode_rows(rows: list, tok: Tokenizer, spec: UnitSpec, schema: pa.Schema) -> pa.RecordBatch:
    texts = [r[2] for r in rows if r[2] is not None]
    encoded = iter(tok.encode_batch(texts))
    eos = spec.eos_id is not None
    eos_piece = np.array([spec.eos_id if eos else 0], dtype=spec.dtype)
    lengths = np.zeros(len(rows), dtype=np.int64)
    pieces = []
    for i, r in enumerate(rows):
        if r[2] is None:
            continue
        ids = next(encoded)
        pieces.append(ids)
        lengths[i] = len(ids) + eos
        if eos:
            pieces.append(eos_piece)
    values = np.concatenate(pieces).astype(spec.dtype, copy=False) if pieces else np.zeros(0, spec.dtype)
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.array([r[2] is not None for r in rows], dtype=bool)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=schema.field("tokens").type.value_type),
                                      mask=pa.array(~valid))
    return pa.record_batch([pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows], pa.string()),
                            tokens, pa.array([r[3] for r in rows], pa.string())], schema=schema)


def tokenize_unit_to_file(unit: Unit, spec: UnitSpec, path: str) -> UnitStats:
    """Tokenize one unit into an Arrow stream file at `path` (written to a temp name, then renamed)."""
    stats = UnitStats(unit.index, 0, 0)
    tmp = path + ".tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_stream(sink, unit_schema(spec.dtype)) as writer:
        for batch in tokenize_unit_batches(unit, spec, stats):
            writer.write_batch(batch)
    os.replace(tmp, path)
    return stats


def tokenize_unit_in_memory(unit: Unit, spec: UnitSpec) -> tuple[UnitStats, list[pa.RecordBatch]]:
    """Tokenize one unit into record batches returned to the caller (for Ray's object store)."""
    stats = UnitStats(unit.index, 0, 0)
    batches = list(tokenize_unit_batches(unit, spec, stats))
    return stats, batches
