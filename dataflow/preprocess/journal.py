"""Crash-safe progress of a tokenize run: a small JSON journal plus append-only spills of open shards.

After each committed unit the journal records how far the run got (the next unit, counters, the
finished shards of every split) and the length of each split's spill: the documents buffered for the
shard still open. A rerun after `kill -9` truncates the spills to those lengths, refills the writers
from them, and continues at the next unit: the result is byte-identical to an uninterrupted run and
committed units are not redone.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dataflow.errors import ConfigError
from dataflow.formats.atomic import write_json_atomic
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.writer import DocIds, ShardWriter

JOURNAL_NAME = "journal.json"
JOURNAL_VERSION = 2  # 2: spills hold blocks of documents
# A spilled block: documents, id bytes, tokens; then token counts (int64 each), id offsets (int64,
# documents + 1), the ids, the tokens.
_BLOCK = struct.Struct("<QQQ")


@dataclass
class Progress:
    """Everything the commit loop needs to continue exactly where it stopped."""

    settings: dict[str, Any]
    version: int = JOURNAL_VERSION
    unit_bytes: int = 0  # the unit cut of this run: a resume must cut the input the same way
    next_unit: int = 0
    next_piece: int = 0  # pieces of unit next_unit committed (a compressed file, cut as it is read)
    current_file: str | None = None
    records_before: int = 0  # records of current_file committed before next_unit
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    errors: int = 0
    errors_log_bytes: int = 0
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_progress(work_dir: str) -> Progress | None:
    path = os.path.join(work_dir, JOURNAL_NAME)
    if not os.path.exists(path):
        return None
    damaged = (f"{path}: the journal of an unfinished run is damaged ({{}}); pass --overwrite to start again")
    try:
        with open(path) as f:
            raw = json.load(f)
    except ValueError as e:
        raise ConfigError(damaged.format(f"not JSON: {e}")) from None
    if not isinstance(raw, dict):
        raise ConfigError(damaged.format(f"a {type(raw).__name__}, not an object"))
    version = raw.get("version", 1)  # journals of version 1 had no version field
    if version != JOURNAL_VERSION:
        raise ConfigError(f"{path}: an unfinished run of another dataflow version (journal version {version}, "
                          f"this one writes {JOURNAL_VERSION}); finish it with that version, or pass --overwrite "
                          f"to start again")
    try:
        progress = Progress(**raw)
    except TypeError as e:
        raise ConfigError(damaged.format(e)) from None
    if not all(isinstance(getattr(progress, k), int) for k in ("next_unit", "documents", "tokens")):
        raise ConfigError(damaged.format("counters that are not integers"))
    return progress


class SpilledWriter:
    """A `ShardWriter` whose open shard is mirrored in an append-only spill file, so it survives a crash."""

    def __init__(self, writer: ShardWriter, work_dir: str, split: str):
        self.writer = writer
        self.work_dir = work_dir
        self.split = split
        self.stale: list[str] = []
        self.spill = None

    def start(self) -> None:
        """Begin a fresh run: an empty spill for the first shard."""
        self._open_spill()

    def _spill_path(self, index: int) -> str:
        return os.path.join(self.work_dir, f"open-{self.split}-{index:05d}.spill")

    def _open_spill(self) -> None:
        self.spill_index = self.writer.next_index
        self.spill = open(self._spill_path(self.spill_index), "wb")  # a stale spill from a crash is discarded

    def write_batch(self, values: np.ndarray, offsets: np.ndarray, ids: DocIds) -> None:
        """Add documents to the writer and to the open shard's spill, a block per shard they touch."""
        values = values.astype(self.writer.dtype, copy=False)
        lengths = np.diff(offsets)
        i = 0
        while i < len(lengths):
            end = i + self.writer.fill_count(lengths[i:])
            part_values, part_offsets = values[offsets[i]:offsets[end]], offsets[i:end + 1] - offsets[i]
            part_ids = ids.slice(i, end)
            self.spill.write(_BLOCK.pack(end - i, len(part_ids.data), part_values.size))
            self.spill.write(np.ascontiguousarray(lengths[i:end], dtype=np.int64).tobytes())
            self.spill.write(part_ids.offsets.astype(np.int64).tobytes())
            self.spill.write(part_ids.data)
            self.spill.write(part_values.tobytes())
            if self.writer.write_batch(part_values, part_offsets, part_ids):  # completed: a new spill
                self.spill.close()
                self.stale.append(self._spill_path(self.spill_index))
                self._open_spill()
            i = end

    def state(self) -> dict[str, Any]:
        """Flush the spill and describe this split for the journal."""
        self.spill.flush()
        os.fsync(self.spill.fileno())
        return {"shards": [asdict(s) for s in self.writer.shards], "next_index": self.writer.next_index,
                "spill_bytes": self.spill.tell()}

    def forget_stale(self) -> None:
        """Delete spills of completed shards (only once a journal no longer needs them)."""
        for path in self.stale:
            if os.path.exists(path):
                os.remove(path)
        self.stale = []

    def restore(self, state: dict[str, Any]) -> None:
        """Return to a journaled state: finished shards as recorded, the open shard refilled from its spill."""
        self.writer.shards = [ShardInfo(**s) for s in state["shards"]]
        self.writer.next_index = state["next_index"]
        path = self._spill_path(state["next_index"])
        with open(path, "ab") as f:
            f.truncate(state["spill_bytes"])
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            docs, id_bytes, size = _BLOCK.unpack_from(data, pos)
            pos += _BLOCK.size
            lengths = np.frombuffer(data, dtype=np.int64, count=docs, offset=pos)
            pos += lengths.nbytes
            id_offsets = np.frombuffer(data, dtype=np.int64, count=docs + 1, offset=pos)
            pos += id_offsets.nbytes
            ids = DocIds(data[pos:pos + id_bytes], id_offsets)
            pos += id_bytes
            tokens = np.frombuffer(data, dtype=self.writer.dtype, count=size, offset=pos)
            pos += tokens.nbytes
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            self.writer.write_batch(tokens, offsets, ids)
        self.spill_index = self.writer.next_index
        self.spill = open(path, "ab")

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


def save_progress(work_dir: str, progress: Progress, writers: dict[str, SpilledWriter]) -> None:
    progress.splits = {name: w.state() for name, w in writers.items()}
    write_json_atomic(os.path.join(work_dir, JOURNAL_NAME), asdict(progress))
    for w in writers.values():
        w.forget_stale()
