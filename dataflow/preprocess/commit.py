"""The coordinator's side of `dataflow tokenize`: one bundle's finished shards -> the dataset, in order.

Workers hand back manifest entries, record counts and bad records, never tokens; committing a bundle
logs its bad records (with line numbers counted across the units of each file), renames its shards from
the scratch folder to their place in the dataset (numbered in input order, per split) and advances the
journal's counters. Its cost is per shard and per bad record, not per token.

The `Committer` is the one owner of a run's `Progress` once the run has started: it alone changes the
counters, appends to the error log and saves the journal (at most every `save_seconds()`, and at the
end), so what the journal says always matches the shards in place and the log's length.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from typing import IO, Any

from dataflow.errors import InputError
from dataflow.preprocess.journal import Progress, save_progress, save_seconds
from dataflow.sources import place
from dataflow.sources.records import Unit
from dataflow.preprocess.worker import BundleResult

CLAIM_AHEAD = 64  # shard numbers claimed past the next bundle's: one extra journal save per 64 shards


class Committer:
    """Commits bundle results in input order into the dataset and keeps the journal of `work_dir`.

    `split_dirs` None: an object store, where workers uploaded the shards to their final names already.
    Use it as a context manager: the error log is open inside, and a clean exit saves the journal."""

    def __init__(self, progress: Progress, work_dir: str, scratch: str, split_dirs: dict[str, str] | None,
                 extension: str, errors_path: str, max_errors: int) -> None:
        self._progress = progress
        self._work_dir, self._scratch, self._split_dirs = work_dir, scratch, split_dirs
        self._extension, self._errors_path, self._max_errors = extension, errors_path, max_errors
        self._errlog: IO[str] | None = None
        self._saved = time.monotonic()

    @property
    def progress(self) -> Progress:
        """The counters and shard lists so far (read them; only the committer changes them)."""
        return self._progress

    def __enter__(self) -> "Committer":
        self._errlog = open(self._errors_path, "a")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self.save()
        finally:
            self._errlog.close()

    def commit(self, result: BundleResult) -> None:
        """Put one bundle in place (the next in input order); save the journal when it is due."""
        if self._split_dirs is not None and claim_names(self._progress, result):
            self.save()  # before the renames: a rerun may remove only names a journal claims
        commit_bundle(result, self._progress, self._scratch, self._split_dirs, self._extension, self._errlog,
                      self._errors_path, self._max_errors)
        if time.monotonic() - self._saved >= save_seconds():
            self.save()

    def save(self) -> None:
        """The journal as of now: the shards in place, the counters and the error log's length."""
        self._errlog.flush()
        self._progress.errors_log_bytes = self._errlog.tell()
        save_progress(self._work_dir, self._progress)
        self._saved = time.monotonic()


def claim_names(progress: Progress, result: BundleResult) -> bool:
    """Claim (in `progress.claimed`) the shard numbers this bundle's shards will take, and `CLAIM_AHEAD` more,
    unless claimed already; True when the claim grew (the journal must be saved before the renames)."""
    if progress.claimed is None:
        progress.claimed = {}
    grew = False
    for split, shards in result.shards.items():
        needed = len(progress.shards.get(split, [])) + len(shards)
        if needed > progress.claimed.get(split, 0):
            progress.claimed[split] = needed + CLAIM_AHEAD
            grew = True
    return grew


def commit_bundle(result: BundleResult, progress: Progress, scratch: str, split_dirs: dict[str, str] | None,
                  extension: str, errlog: IO[str], errors_path: str, max_errors: int) -> None:
    """Log the bundle's bad records, put its shards in place (`split_dirs` None: the workers uploaded them to
    their final names already) and count it as done in `progress`."""
    _log_errors(result, progress, errlog, errors_path, max_errors)
    for split, shards in result.shards.items():
        listed = progress.shards.setdefault(split, [])
        if split_dirs is None:  # uploaded: the store's tag is checked again before the manifest (`finish.py`)
            listed += [{**asdict(shard), "tag": result.tags.get(split, {}).get(shard.path, "")} for shard in shards]
            continue
        for shard in shards:
            name = f"shard-{len(listed):05d}{extension}"
            os.replace(os.path.join(scratch, shard.path), os.path.join(split_dirs[split], name))
            listed.append(asdict(replace(shard, path=name)))
    progress.documents += result.documents
    progress.tokens += result.tokens
    progress.text_bytes += result.text_bytes
    last = result.units[-1]
    if last.piece >= 0 and not last.last:  # a piece of a compressed file, more to come
        progress.next_piece = last.piece + 1
    else:
        progress.next_unit, progress.next_piece = last.index + 1, 0


def _log_errors(result: BundleResult, progress: Progress, errlog: IO[str], errors_path: str,
                max_errors: int) -> None:
    """The bad records of a bundle, in input order, placed by their line (or row) in their file."""
    errors = iter(result.errors)
    error = next(errors, None)
    for k, unit in enumerate(result.units):
        if unit.file != progress.current_file:
            progress.current_file, progress.records_before = unit.file, 0
        while error is not None and error[0] == k:
            _log_error(unit, progress.records_before + error[1], error[2], error[3], progress, errlog, errors_path,
                       max_errors)
            error = next(errors, None)
        progress.records_before += result.records[k]


def _log_error(unit: Unit, record: int, doc_id: Any, reason: str, progress: Progress, errlog: IO[str],
               errors_path: str, max_errors: int) -> None:
    progress.errors += 1
    where = place(unit.kind, record)  # {"line": from 1} (JSONL, text) or {"row": from 0} (Parquet, datasets)
    errlog.write(json.dumps({"file": unit.file, **where, "id": doc_id, "reason": reason}) + "\n")
    if progress.errors > max_errors:
        errlog.flush()
        where_text = ", ".join(f"{k} {v}" for k, v in where.items())
        raise InputError(f"{unit.file} {where_text}: {reason} — {progress.errors} bad records, "
                         f"more than --max-errors {max_errors}; see {errors_path}")
