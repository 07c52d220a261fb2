"""The worker side of `dataflow tokenize`: one work unit -> a stream of tokenized record batches.

A unit's output is an Arrow record-batch stream with one row per input record, in input order:
`position` (record index in the unit; in a text file, the line the record starts at), `id` (null when the
input has none), `tokens` (null for a bad record) and `error` (why a record is bad). Workers write it to a
local file that the main process reads back batch by batch, so neither side holds a whole unit in memory,
however large the unit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from dataflow.preprocess.blocks import Block, block_of, read_unit_blocks
from dataflow.preprocess.flat import append_eos, string_buffers
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.tokenizers import Tokenizer, load_tokenizer


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


def adopt_tokenizer(tokenizer: str, engine: str, tok: Tokenizer) -> None:
    """Let units tokenized in this process use a tokenizer it has loaded already (one load, one proof)."""
    _TOKENIZERS[(tokenizer, engine)] = tok


def tokenize_unit_batches(unit: Unit, spec: UnitSpec, stats: UnitStats) -> Iterator[pa.RecordBatch]:
    """Read and tokenize one unit; yields one record batch per block of input (about BLOCK_BYTES)."""
    tok = worker_tokenizer(spec.tokenizer, spec.engine)
    schema = unit_schema(spec.dtype)
    empty = True
    for block in read_unit_blocks(unit, spec.text_field, spec.id_field):
        batch, text_bytes = encode_block(block, stats.records, tok, spec, schema)
        stats.records += len(block)
        stats.text_bytes += text_bytes
        empty = False
        yield batch
    if empty:
        yield encode_block(block_of([]), 0, tok, spec, schema)[0]


def encode_block(block: Block, first: int, tok: Tokenizer, spec: UnitSpec, schema: pa.Schema) \
        -> tuple[pa.RecordBatch, int]:
    """One block as a record batch (positions from `first`) and the UTF-8 bytes of its good texts.

    The good texts go to the engine as one Arrow array; its flat ids, EOS added with array operations,
    become the `tokens` list column directly (a bad record is a null row of length 0)."""
    n = len(block)
    good = block.texts.drop_null() if block.texts.null_count else block.texts
    values, offsets = append_eos(tok.encode_flat(good), spec.eos_id, spec.dtype)
    if block.texts.null_count:
        valid = block.texts.is_valid().to_numpy(zero_copy_only=False)
        lengths = np.zeros(n, dtype=np.int64)
        lengths[valid] = np.diff(offsets)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        mask = pa.array(~valid)
    else:
        mask = None
    value_type = schema.field("tokens").type.value_type
    tokens = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type),
                                      mask=mask)
    positions = pa.array(np.arange(first, first + n, dtype=np.int64) if block.positions is None else block.positions)
    batch = pa.record_batch([positions, block.ids, tokens, block.errors], schema=schema)
    return batch, int(string_buffers(good)[0][-1])


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
