"""`dataflow verify`: every shard checked against the manifest (checksum, size, counts, structure)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from dataflow.errors import FormatError
from dataflow.formats.hashing import sha256_file
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo
from dataflow.formats.reader import iter_shard_batches


@dataclass
class ShardProblem:
    path: str
    problem: str


def verify_shard(dataset: str, shard: ShardInfo, manifest: Manifest, deep: bool = True) -> str | None:
    """What is wrong with one shard, or None when it is sound. Deep checks read it as the loader and
    `decode` do (the same parsers, the same limits, its counts against its manifest entry, each token's
    type and range)."""
    path = os.path.join(dataset, shard.path)
    try:
        if not os.path.exists(path):
            return "missing"
        size = os.path.getsize(path)
        if size != shard.bytes:
            return f"size {size} bytes, manifest says {shard.bytes} (truncated or replaced)"
        digest = sha256_file(path)
        if digest != shard.sha256:
            return f"sha256 {digest[:12]}… does not match the manifest's {shard.sha256[:12]}… (corrupt)"
        if deep:
            for _ in iter_shard_batches(path, manifest, shard):
                pass
        return None
    except FormatError as e:
        return str(e).removeprefix(f"{path}: ")
    except Exception as e:  # anything else a damaged file provokes is reported, and the next shard checked
        return f"unreadable ({type(e).__name__}: {e})"


def verify_dataset(dataset: str, manifest: Manifest,
                   on_shard: Callable[[ShardInfo], None] | None = None) -> list[ShardProblem]:
    """All problems found, one per bad shard (and one for manifest totals that are not the sums of its
    shard entries); empty when the dataset is sound. `on_shard` is called after each shard is checked (for a
    progress bar)."""
    totals = manifest.totals_problem()
    problems = [ShardProblem(MANIFEST_NAME, totals)] if totals else []
    for shard in manifest.shards:
        problem = verify_shard(dataset, shard, manifest)
        if problem:
            problems.append(ShardProblem(shard.path, problem))
        if on_shard is not None:
            on_shard(shard)
    return problems
