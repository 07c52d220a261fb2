"""`dataflow verify`: every shard checked against the manifest (checksum, size, counts, structure).

A local dataset is checked in place. A dataset at a URL is checked through the `ShardFiles` its caller
passes (see `formats/reader.py`): each shard is downloaded once, its size and sha256 checked against the
manifest as it lands (a mismatch, or a shard the store does not have, is that shard's problem), then read
as the loader reads it. A store that cannot be read at all (credentials, network, a server's errors after
the retries) stops the check with one error: no verdict is given on shards that were not seen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from dataflow.errors import DataflowError, FormatError
from dataflow.formats.hashing import sha256_file
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo
from dataflow.formats.reader import ShardFiles, iter_shard_batches, shard_files


@dataclass
class ShardProblem:
    path: str
    problem: str


def verify_shard(dataset: str, shard: ShardInfo, manifest: Manifest, deep: bool = True,
                 files: ShardFiles | None = None) -> str | None:
    """What is wrong with one shard, or None when it is sound. Deep checks read it as the loader and
    `decode` do (the same parsers, the same limits, its counts against its manifest entry, each token's
    type and range). `files`: where the shards are read from (default: in place, for a local folder)."""
    files = shard_files(dataset, files)
    name = files.name(shard)
    try:
        with files.local(shard) as path:
            problem = None if files.verified else _bytes_problem(path, shard)
            if problem is None and deep:
                for _ in iter_shard_batches(path, manifest, shard, name):
                    pass
            return problem
    except FormatError as e:
        return str(e).removeprefix(f"{name}: ")
    except DataflowError:  # the store cannot be read (credentials, network, server): no verdict on the shard
        raise
    except Exception as e:  # anything else a damaged file provokes is reported, and the next shard checked
        return f"unreadable ({type(e).__name__}: {e})"


def _bytes_problem(path: str, shard: ShardInfo) -> str | None:
    """A local file's size and sha256 against the shard's manifest entry."""
    if not os.path.exists(path):
        return "missing"
    size = os.path.getsize(path)
    if size != shard.bytes:
        return f"size {size} bytes, manifest says {shard.bytes} (truncated or replaced)"
    digest = sha256_file(path)
    if digest != shard.sha256:
        return f"sha256 {digest[:12]}… does not match the manifest's {shard.sha256[:12]}… (corrupt)"
    return None


def verify_dataset(dataset: str, manifest: Manifest, on_shard: Callable[[ShardInfo], None] | None = None,
                   files: ShardFiles | None = None) -> list[ShardProblem]:
    """All problems found, one per bad shard (and one for manifest totals that are not the sums of its
    shard entries); empty when the dataset is sound. `on_shard` is called after each shard is checked (for a
    progress bar); `files`: where the shards are read from (default: in place, for a local folder)."""
    files = shard_files(dataset, files)
    totals = manifest.totals_problem()
    problems = [ShardProblem(MANIFEST_NAME, totals)] if totals else []
    for shard in manifest.shards:
        problem = verify_shard(dataset, shard, manifest, files=files)
        if problem:
            problems.append(ShardProblem(shard.path, problem))
        if on_shard is not None:
            on_shard(shard)
    return problems
