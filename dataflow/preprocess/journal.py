"""Crash-safe progress of a tokenize run: a small JSON journal of the bundles committed so far.

Workers write finished shards; the coordinator renames them into the dataset in input order and, after
committed bundles (at most every `save_seconds()`), records how far the run got (the next unit or piece,
the counters, every split's shards). Before it renames a shard in under a number the journal has not
claimed yet, it saves a claim on the next numbers. A rerun after `kill -9` drops the shards the journal
claimed but does not list (they are written again, with the same bytes) and continues at the next bundle:
the result is identical to an uninterrupted run. The journal's size grows with the shards, not the tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from dataflow import env
from dataflow.errors import ConfigError
from dataflow.formats.atomic import write_json_atomic

JOURNAL_NAME = "journal.json"
INPUTS_NAME = "inputs.json"
VERSIONS_NAME = "input_versions.json"
# 2: spills hold blocks of documents; 3: written record batches stay in the shard's temp file;
# 4: workers write whole shards, the journal lists them (no open shard, no spill); 5: Arrow record batches of
# 256K tokens with their byte ranges (a run of 4 resumed would mix two shard layouts in one dataset)
JOURNAL_VERSION = 5


def save_seconds() -> float:
    """How long after the last save a committed bundle saves the journal again (DATAFLOW_JOURNAL_SECONDS):
    a crash redoes at most about that much work."""
    return env.number("DATAFLOW_JOURNAL_SECONDS", 1.0)


@dataclass
class Progress:
    """Everything the commit loop needs to continue exactly where it stopped."""

    settings: dict[str, Any]
    version: int = JOURNAL_VERSION
    next_unit: int = 0  # the first unit of the next bundle to commit
    next_piece: int = 0  # pieces of unit next_unit committed (a compressed file, cut as it is read)
    current_file: str | None = None
    records_before: int = 0  # records of current_file committed before next_unit
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    errors: int = 0
    errors_log_bytes: int = 0
    shards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per split, in order
    # per split: shards numbered below this may be in place though not listed yet (a local run claims the
    # names before it renames shards in: `ownership.py`); None in journals written before claims
    claimed: dict[str, int] | None = None


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
    if not isinstance(progress.shards, dict) or not all(isinstance(v, list) for v in progress.shards.values()):
        raise ConfigError(damaged.format("a shard list that is not one"))
    return progress


def save_inputs(work_dir: str, inputs: list[list[Any]]) -> None:
    """The run's input files ([name in ids, bytes] each) beside the journal, written when a run starts or
    resumes: the journal, saved every second, carries only their digest (`input_digest`)."""
    write_json_atomic(os.path.join(work_dir, INPUTS_NAME), inputs)


def load_inputs(work_dir: str) -> list[Any] | None:
    """What `save_inputs` wrote, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(work_dir, INPUTS_NAME)) as f:
            inputs = json.load(f)
    except (OSError, ValueError):
        return None
    return inputs if isinstance(inputs, list) else None


def save_versions(work_dir: str, versions: dict[str, str | None]) -> None:
    """Each input file's version (its name in ids -> modification time or ETag, `plan.file_facts`) beside the
    journal, written with `save_inputs`: a file edited in place to the same size has another one."""
    write_json_atomic(os.path.join(work_dir, VERSIONS_NAME), versions)


def load_versions(work_dir: str) -> dict[str, Any] | None:
    """What `save_versions` wrote, or None when it is missing (a run of before it) or unreadable."""
    try:
        with open(os.path.join(work_dir, VERSIONS_NAME)) as f:
            versions = json.load(f)
    except (OSError, ValueError):
        return None
    return versions if isinstance(versions, dict) else None


def input_digest(inputs: list[list[Any]]) -> dict[str, Any]:
    """What settings record of the input files: their number and a sha256 of the list (a corpus of a million
    files must not make every journal save rewrite megabytes)."""
    text = json.dumps(inputs, separators=(",", ":"), ensure_ascii=False)
    return {"files": len(inputs), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def save_progress(work_dir: str, progress: Progress) -> None:
    """Write the journal atomically (the shards it lists are already in place)."""
    write_json_atomic(os.path.join(work_dir, JOURNAL_NAME), asdict(progress))
