"""The commit side of `dataflow tokenize`: one unit's tokenized records -> the split writers, in order.

This runs in the single process that owns the output, for every record of the corpus, so it works a
record batch at a time: ids, the train/val split and the token buffers are handled as arrays, and
only bad records (rare) and hashing for a validation split take a step per record.
"""

from __future__ import annotations

import hashlib
import json
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.errors import InputError
from dataflow.formats.writer import DocIds
from dataflow.preprocess.executors import UnitOutput
from dataflow.preprocess.journal import Progress, SpilledWriter
from dataflow.preprocess.plan import Unit


def in_val_split(doc_id: str, seed: int, fraction: float) -> bool:
    """Deterministic per-document split: a hash of (seed, id) mapped to [0, 1)."""
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64 < fraction


def commit_unit(out: UnitOutput, unit: Unit, name: str, progress: Progress, writers: dict[str, SpilledWriter],
                errlog: IO[str], errors_path: str, *, max_errors: int, seed: int, val_fraction: float) -> None:
    """Write one unit's documents into the split writers and its bad records into the error log."""
    if unit.file != progress.current_file:
        progress.current_file, progress.records_before = unit.file, 0
    for batch in out.batches:
        _commit_batch(batch, unit, name, progress, writers, errlog, errors_path, max_errors, seed, val_fraction)
    progress.records_before += out.stats.records
    progress.text_bytes += out.stats.text_bytes
    out.cleanup()


def _commit_batch(batch: pa.RecordBatch, unit: Unit, name: str, progress: Progress,
                  writers: dict[str, SpilledWriter], errlog: IO[str], errors_path: str, max_errors: int,
                  seed: int, val_fraction: float) -> None:
    records = progress.records_before + batch.column(0).to_numpy()
    ids, tokens, errors = batch.column(1), batch.column(2), batch.column(3)
    good = np.ones(len(batch), dtype=bool)
    if errors.null_count < len(errors):
        for i in np.flatnonzero(errors.is_valid().to_numpy(zero_copy_only=False)).tolist():
            good[i] = False
            _log_error(unit, int(records[i]), ids[i].as_py(), errors[i].as_py(), progress, errlog, errors_path,
                       max_errors)
    if not good.any():
        return
    if not good.all():
        keep = pa.array(good)
        ids, tokens, records = ids.filter(keep), tokens.filter(keep), records[good]
    ids = _with_default_ids(ids, records, unit, name)
    if val_fraction > 0:
        to_val = np.array([in_val_split(d, seed, val_fraction) for d in ids.to_pylist()], dtype=bool)
        for split, mask in (("train", ~to_val), ("val", to_val)):
            if mask.any():
                keep = pa.array(mask)
                _write(writers[split], tokens.filter(keep), ids.filter(keep), progress)
    else:
        _write(writers["train"], tokens, ids, progress)


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


def _with_default_ids(ids: pa.Array, records: np.ndarray, unit: Unit, name: str) -> pa.Array:
    """Records without an id field are named after their place: `file:line`, `file:row`, or `file`."""
    if not ids.null_count:
        return ids
    if unit.kind == "text":
        default = pa.array([name] * len(ids), pa.string())
    else:
        numbers = records + 1 if unit.kind == "jsonl" else records
        default = pc.binary_join_element_wise(pa.scalar(f"{name}:"), pc.cast(pa.array(numbers), pa.string()), "")
    return pc.if_else(ids.is_null(), default, ids)


def _write(writer: SpilledWriter, tokens: pa.ListArray, ids: pa.Array, progress: Progress) -> None:
    offsets = tokens.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    values = tokens.flatten().to_numpy(zero_copy_only=False)
    writer.write_batch(values, offsets, DocIds.from_arrow(ids))
    progress.documents += len(ids)
    progress.tokens += int(values.size)
