"""Crash-safe progress of a tokenize run: a small JSON journal plus append-only spills of open shards.

After committed units (at most every `save_seconds()`) the journal records how far the run got (the next unit,
counters, the finished shards of every split), how much of each open shard's temp file holds record batches
(fsynced), and the length of each split's spill: the documents the writer still holds in memory. A rerun
after `kill -9` rewrites the open shards from those batches and spills and continues at the next unit: the
result is byte-identical to an uninterrupted run, and units committed before the last save are not redone.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dataflow import env
from dataflow.errors import ConfigError
from dataflow.formats.atomic import write_json_atomic
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.writer import DocIds, ShardWriter

JOURNAL_NAME = "journal.json"
# the journal is saved after a committed unit once this long has passed since the last save: a crash redoes at
# most that much committing (each save waits for the shard writer and fsyncs)
def save_seconds() -> float:
    """How long after the last save a committed unit saves the journal again (DATAFLOW_JOURNAL_SECONDS)."""
    return env.number("DATAFLOW_JOURNAL_SECONDS", 1.0)
JOURNAL_VERSION = 3  # 2: spills hold blocks of documents; 3: written record batches stay in the shard's temp file
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
    """A `ShardWriter` whose open shard survives a crash: the record batches it has written are made durable
    in the shard's temp file, and the documents it still holds in memory are mirrored in a spill file.

    The spill holds only documents in no file yet (less than one record batch for Arrow; the open shard for
    tar), appended at each journal save; it starts afresh when the writer's buffer does. So each token is
    written once to its shard, not a second time to a journal.
    """

    def __init__(self, writer: ShardWriter, work_dir: str, split: str):
        self.writer = writer
        self.work_dir = work_dir
        self.split = split
        self.stale: list[str] = []  # files the journal still names until the next save
        self.spill = None
        self.spill_name = ""
        self._spilled: tuple[int, int] = (-1, -1)  # (shard index, buffer generation) the spill mirrors
        self._spilled_docs = 0
        self._file_state: dict[str, Any] | None = None

    def write_batch(self, values: np.ndarray, offsets: np.ndarray, ids: DocIds) -> None:
        self.writer.write_batch(values.astype(self.writer.dtype, copy=False), offsets, ids)

    def _open_spill(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.stale.append(os.path.join(self.work_dir, self.spill_name))
        # a name no earlier run used: the journal may still name that run's spill until the next save
        self.spill_name = f"open-{self.split}-{self.writer.next_index:05d}-{secrets.token_hex(6)}.spill"
        self.spill = open(os.path.join(self.work_dir, self.spill_name), "wb")
        self._spilled = (self.writer.next_index, self.writer.pending_generation)
        self._spilled_docs = 0

    def state(self) -> dict[str, Any]:
        """Make the open shard durable (its written batches, and its buffered documents in the spill) and
        describe this split for the journal."""
        file_state = self.writer.sync()
        if (self.writer.next_index, self.writer.pending_generation) != self._spilled:
            self._open_spill()
        if self.writer.pending_count > self._spilled_docs:
            values, offsets, ids = self.writer.pending_documents(self._spilled_docs)
            lengths = np.diff(offsets)
            self.spill.write(_BLOCK.pack(len(lengths), len(ids.data), values.size))
            self.spill.write(lengths.astype(np.int64).tobytes())
            self.spill.write(ids.offsets.astype(np.int64).tobytes())
            self.spill.write(ids.data)
            self.spill.write(values.tobytes())
            self._spilled_docs = self.writer.pending_count
        self.spill.flush()
        os.fsync(self.spill.fileno())
        if self._file_state is not None and (file_state is None or file_state["temp"] != self._file_state["temp"]):
            self.stale.append(os.path.join(self.writer.out, self._file_state["temp"]))  # a resumed run's old one
        self._file_state = file_state
        return {"shards": [asdict(s) for s in self.writer.shards], "next_index": self.writer.next_index,
                "file": file_state, "spill": self.spill_name, "spill_bytes": self.spill.tell()}

    def forget_stale(self) -> None:
        """Delete spills and temp files the journal no longer names (only once it no longer does)."""
        for path in self.stale:
            if os.path.exists(path):
                os.remove(path)
        self.stale = []

    def restore(self, state: dict[str, Any]) -> None:
        """Return to a journaled state: finished shards as recorded, the open shard's written batches rewritten
        from its file, its buffered documents from the spill."""
        self.writer.shards = [ShardInfo(**s) for s in state["shards"]]
        self.writer.next_index = state["next_index"]
        if state.get("file"):
            self.writer.reopen(state["file"])
            self._file_state = state["file"]  # removed once a journal no longer names it
        if state.get("spill"):
            path = os.path.join(self.work_dir, state["spill"])
            try:
                with open(path, "rb") as f:
                    data = f.read(state["spill_bytes"])
            except FileNotFoundError:
                data = b""
            if len(data) < state["spill_bytes"]:
                raise ConfigError(f"{path}: missing or shorter than the journal records; pass --overwrite to start "
                                  f"again")
            self._replay(data)
            self.stale.append(path)

    def _replay(self, data: bytes) -> None:
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
            self.writer.write_batch(tokens, np.concatenate([[0], np.cumsum(lengths)]), ids)

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    def release(self) -> None:
        """Once the journal is gone (the run finished): delete the files only it needed, such as the unfinished
        shard a resumed run started from."""
        if self._file_state is not None:
            self.stale.append(os.path.join(self.writer.out, self._file_state["temp"]))
        self.forget_stale()


def save_progress(work_dir: str, progress: Progress, writers: dict[str, SpilledWriter]) -> None:
    progress.splits = {name: w.state() for name, w in writers.items()}
    write_json_atomic(os.path.join(work_dir, JOURNAL_NAME), asdict(progress))
    for w in writers.values():
        w.forget_stale()
