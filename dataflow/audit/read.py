"""Reading an audit folder: every `audit-rank-*.jsonl` file, its sessions and their records, in order.

A line that is not a whole record (a write torn by a kill, a header lost with it) is kept aside as
unreadable, never fatal: what it held is then reported missing by the replay, not as corruption.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

from dataflow.errors import ConfigError

KINDS = ("session", "walk", "steps", "end")
_NEEDS = {"session": ("session", "rank", "world_size", "samples", "dataset", "batch_size"),
          "walk": ("session", "walk", "t", "epoch", "consumed", "via", "layout", "batches"),
          "steps": ("session", "walk", "epoch", "pos", "steps", "at", "t", "layout"),
          "end": ("session", "t", "epoch", "consumed")}


@dataclass
class Session:
    """One loader's (or one worker's) records in one process, in the order they were written."""

    header: dict[str, Any]
    file: str
    order: int  # which session of the folder, in reading order
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Whether it stopped cleanly (`close()` or a normal exit wrote `end` after its last step)."""
        return bool(self.records) and self.records[-1]["kind"] == "end"

    @property
    def last_t(self) -> float:
        return max([r["t"] for r in self.records] or [self.header.get("t", 0.0)])

    @property
    def key(self) -> tuple:
        """What names the data: sessions of one key are audited together."""
        h = self.header
        return h["dataset"], h.get("seed"), h["samples"], h.get("seq_len")


@dataclass
class Folder:
    path: str
    files: list[str]
    sessions: list[Session]
    unreadable: list[dict[str, Any]]  # {"file", "line", "why"}


def read_folder(path: str) -> Folder:
    """Every audit record under `path` (a `ConfigError` when there is none to read)."""
    if not os.path.isdir(path):
        raise ConfigError(f"{path}: no such folder; pass the folder given to the loader as audit=")
    files = sorted(glob.glob(os.path.join(path, "audit-rank-*.jsonl")), key=_rank_order)
    if not files:
        raise ConfigError(f"{path}: holds no audit-rank-*.jsonl file; pass the folder given to the loader as "
                          f"audit= (written once it served a batch)")
    sessions: dict[str, Session] = {}
    unreadable: list[dict[str, Any]] = []
    for name in files:
        with open(name, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                record, why = _parse(line)
                if record is not None and record["kind"] == "session":
                    sessions[record["session"]] = Session(record, os.path.basename(name), len(sessions))
                elif record is not None and record["session"] in sessions:
                    sessions[record["session"]].records.append(record)
                else:
                    unreadable.append({"file": os.path.basename(name), "line": n,
                                       "why": why or "its session's first line is missing"})
    return Folder(path, [os.path.basename(f) for f in files], list(sessions.values()), unreadable)


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        record = json.loads(line)
    except ValueError:
        return None, "not a whole JSON record (a write cut short)"
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        return None, "not an audit record"
    missing = [k for k in _NEEDS[record["kind"]] if k not in record]
    if missing:
        return None, f"a {record['kind']} record without {', '.join(missing)}"
    return record, None


def _rank_order(name: str) -> tuple:
    parts = os.path.basename(name)[len("audit-rank-"):-len(".jsonl")].split("-worker-")
    return tuple(int(p) if p.isdigit() else -1 for p in parts), name
