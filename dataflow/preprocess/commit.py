"""The coordinator's side of `dataflow tokenize`: one bundle's finished shards -> the dataset, in order.

Workers hand back manifest entries, record counts and bad records, never tokens; committing a bundle
logs its bad records (with line numbers counted across the units of each file), renames its shards from
the scratch folder to their place in the dataset (numbered in input order, per split) and advances the
journal's counters. Its cost is per shard and per bad record, not per token.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from typing import IO, Any

from dataflow.errors import InputError
from dataflow.preprocess.journal import Progress
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.worker import BundleResult


def commit_bundle(result: BundleResult, progress: Progress, scratch: str, split_dirs: dict[str, str] | None,
                  extension: str, errlog: IO[str], errors_path: str, max_errors: int) -> None:
    """Log the bundle's bad records, put its shards in place (`split_dirs` None: the workers uploaded them to
    their final names already) and count it as done in `progress`."""
    _log_errors(result, progress, errlog, errors_path, max_errors)
    for split, shards in result.shards.items():
        listed = progress.shards.setdefault(split, [])
        if split_dirs is None:
            listed += [asdict(shard) for shard in shards]
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
    where = {"row": record} if unit.kind == "parquet" else {"line": record + 1}  # JSONL and text: lines from 1
    errlog.write(json.dumps({"file": unit.file, **where, "id": doc_id, "reason": reason}) + "\n")
    if progress.errors > max_errors:
        errlog.flush()
        where_text = ", ".join(f"{k} {v}" for k, v in where.items())
        raise InputError(f"{unit.file} {where_text}: {reason} — {progress.errors} bad records, "
                         f"more than --max-errors {max_errors}; see {errors_path}")
