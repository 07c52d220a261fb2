"""The worker side of `dataflow tokenize`: one bundle of units (or one piece) -> finished shard files; a
compressed JSONL file sent whole -> the same, for each of the pieces it cuts the file into.

A worker reads its units, tokenizes them a block at a time, names the documents that carry no id, assigns
each document to train or val, and writes the shards of every split itself: compressed, hashed and
renamed into place in the run's scratch folder. What it returns is small (the shards' manifest entries,
the record counts and the bad records), so the coordinator never touches a token: it only orders the
shards, renames them into the dataset and keeps the journal. Everything a worker decides depends on its
units alone, so the bytes never depend on which worker, executor or machine tokenized them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dataflow.formats.manifest import ShardInfo, TokenizerMeta
from dataflow.formats.writer import DocIds, ShardWriter
from dataflow.formats import arrays
from dataflow.sources import Block, TextFields, compressed_file, default_ids, pieces, read_unit_blocks
from dataflow.tokenizers.flat import frame, string_buffers
from dataflow.preprocess.output import upload_shards
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES
from dataflow.sources.records import Unit
from dataflow.tokenizers.load import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class UnitSpec:
    """What every unit needs to know, shipped with each bundle (a few hundred bytes)."""

    tokenizer: str
    engine: str
    text_field: str | TextFields  # one field's name, or the parsed --text-field of several (sources.parse_text_fields)
    id_field: str
    eos_id: int | None
    meta: TokenizerMeta
    splits: tuple[str, ...] = ("train",)
    format: str = "arrow"
    compression: str = "zstd"
    shard_size: int = 128 << 20
    zstd_level: int | None = None
    seed: int = 0
    val_fraction: float = 0.0
    remote_dirs: dict[str, str] | None = None  # object-store output: each split's URL, where workers upload
    piece_bytes: int = DEFAULT_UNIT_BYTES  # how a compressed file sent whole is cut (as the coordinator would)
    bos_id: int | None = None  # before each document (eos_id: after it); see config.framing_of
    special_tokens: str = "text"  # special-token strings in documents: "text" or "parse" (as their ids)


@dataclass
class BundleResult:
    """What a worker returns for one bundle: no token, only what the coordinator orders and logs."""

    units: list[Unit]  # without their data
    records: list[int] = field(default_factory=list)  # records read, per unit
    errors: list[tuple[int, int, Any, str]] = field(default_factory=list)  # (unit k, position, id, reason)
    shards: dict[str, list[ShardInfo]] = field(default_factory=dict)  # paths: file names in the scratch folder
    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # split -> uploaded shard -> the store's tag
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0

    @property
    def unit(self) -> Unit:
        """The bundle's first unit (a piece, for a compressed file)."""
        return self.units[0]


def in_val_split(doc_id: str, seed: int, fraction: float) -> bool:
    """Deterministic per-document split: a hash of (seed, id) mapped to [0, 1)."""
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64 < fraction


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


def shard_prefix(unit: Unit, split: str) -> str:
    """The scratch names of a bundle's shards: its first unit (and piece), its split."""
    return f"unit-{unit.index:08d}-{max(unit.piece, 0):06d}-{split}-"


def tokenize_bundle(bundle: list[Unit], spec: UnitSpec, scratch: str) -> list[BundleResult]:
    """Tokenize a bundle of units into finished shards in `scratch` (one or more per split that got
    documents; a shard closes at `spec.shard_size` bytes of tokens and at the end of the bundle): its result.
    A compressed JSONL file sent whole is cut here, as the coordinator would cut it: one result per piece."""
    if compressed_file(bundle):
        return _tokenize_pieces(bundle[0], spec, scratch)
    try:
        return [_tokenize_bundle(bundle, spec, scratch)]
    finally:
        for unit in bundle:  # a piece's spill file is this worker's once handed over: read or failed, it goes
            if unit.spill:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(unit.spill)


def _tokenize_pieces(unit: Unit, spec: UnitSpec, scratch: str) -> list[BundleResult]:
    """A compressed JSONL file from piece `unit.skip` on, each piece tokenized as a bundle of its own; on a
    failure the shards of the pieces done go too (no result is returned for them)."""
    results: list[BundleResult] = []
    try:
        for piece in pieces(unit, spec.piece_bytes, unit.skip):
            results.append(_tokenize_bundle([piece], spec, scratch))
    except BaseException:
        for result in results:
            _remove_shards(scratch, [s for shards in result.shards.values() for s in shards])
        raise
    return results


def _remove_shards(scratch: str, shards: list[ShardInfo]) -> None:
    for shard in shards:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(scratch, shard.path))


def _tokenize_bundle(bundle: list[Unit], spec: UnitSpec, scratch: str) -> BundleResult:
    tok = worker_tokenizer(spec.tokenizer, spec.engine)
    result = BundleResult([u.without_data() for u in bundle])
    writers = {split: ShardWriter(scratch, tokenizer_meta=spec.meta, format=spec.format,
                                  compression=spec.compression, shard_size=spec.shard_size,
                                  zstd_level=spec.zstd_level, prefix=shard_prefix(bundle[0], split))
               for split in spec.splits}
    try:
        for k, unit in enumerate(bundle):
            read = 0
            for block in read_unit_blocks(unit, spec.text_field, spec.id_field):
                _write_block(block, k, read, unit, tok, spec, writers, result)
                read += len(block)
            result.records.append(read)
        for split, w in writers.items():
            w.flush()
            result.shards[split] = list(w.shards)
        if spec.remote_dirs:  # straight to their final names: an object store has no rename
            for split, shards in result.shards.items():
                result.shards[split], result.tags[split] = upload_shards(scratch, shards, spec.remote_dirs[split],
                                                                         split)
    except BaseException:
        for w in writers.values():
            w.abort()
            _remove_shards(scratch, w.shards)
        raise
    return result


def _write_block(block: Block, k: int, first: int, unit: Unit, tok: Tokenizer, spec: UnitSpec,
                 writers: dict[str, ShardWriter], result: BundleResult) -> None:
    """One block: its bad records to `result.errors`, its documents tokenized into the split writers."""
    n = len(block)
    positions = np.arange(first, first + n, dtype=np.int64) if block.positions is None else block.positions
    good = arrays.valid_mask(block.texts)  # no text: a bad record (its error says why) or a blank line (none)
    if block.errors.null_count < n:
        for i in np.flatnonzero(arrays.valid_mask(block.errors)).tolist():
            good[i] = False
            result.errors.append((k, int(positions[i]), block.ids[i].as_py(), block.errors[i].as_py()))
    if not good.any():
        return
    keep = None if good.all() else arrays.bools(good)
    texts = block.texts if keep is None else block.texts.filter(keep)
    ids = default_ids(unit, block, positions)  # named after their place when the input carries none
    ids = ids if keep is None else ids.filter(keep)
    values, offsets = frame(tok.encode_docs(texts, spec.special_tokens), spec.bos_id, spec.eos_id, spec.meta.dtype)
    result.text_bytes += int(string_buffers(texts)[0][-1])
    if spec.val_fraction > 0:
        to_val = np.array([in_val_split(d, spec.seed, spec.val_fraction) for d in ids.to_pylist()], dtype=bool)
        for split, mask in (("train", ~to_val), ("val", to_val)):
            if mask.any():
                _write(writers[split], values, offsets, ids, mask, result)
    else:
        _write(writers["train"], values, offsets, ids, None, result)


def _write(writer: ShardWriter, values: np.ndarray, offsets: np.ndarray, ids: pa.Array, mask: np.ndarray | None,
           result: BundleResult) -> None:
    """The documents of `mask` (all: None) into `writer`."""
    if mask is not None and not mask.all():
        lengths = np.diff(offsets)[mask]
        values = values[np.repeat(mask, np.diff(offsets))]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = ids.filter(arrays.bools(mask))
    writer.write_batch(values, offsets, DocIds.from_arrow(ids))
    result.documents += len(ids)
    result.tokens += int(values.size)
