"""`dataflow verify`: every shard checked against the manifest (checksum, size, counts, structure)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from dataflow.errors import FormatError
from dataflow.formats.hashing import sha256_file
from dataflow.formats.manifest import Manifest, ShardInfo
from dataflow.formats.reader import iter_shard_documents


@dataclass
class ShardProblem:
    path: str
    problem: str


def verify_shard(dataset: str, shard: ShardInfo, manifest: Manifest, deep: bool = True) -> str | None:
    """What is wrong with one shard, or None when it is sound."""
    path = os.path.join(dataset, shard.path)
    if not os.path.exists(path):
        return "missing"
    size = os.path.getsize(path)
    if size != shard.bytes:
        return f"size {size} bytes, manifest says {shard.bytes} (truncated or replaced)"
    digest = sha256_file(path)
    if digest != shard.sha256:
        return f"sha256 {digest[:12]}… does not match the manifest's {shard.sha256[:12]}… (corrupt)"
    if deep:
        try:
            docs = tokens = 0
            for _, toks in iter_shard_documents(path, manifest):
                docs += 1
                tokens += len(toks)
        except FormatError as e:
            return str(e)
        if (docs, tokens) != (shard.documents, shard.tokens):
            return (f"holds {docs} documents / {tokens} tokens, manifest says "
                    f"{shard.documents} / {shard.tokens}")
    return None


def verify_dataset(dataset: str, manifest: Manifest,
                   on_shard: Callable[[ShardInfo], None] | None = None) -> list[ShardProblem]:
    """All problems found, one per bad shard; empty when the dataset is sound. `on_shard` is called
    after each shard is checked (for a progress bar)."""
    problems = []
    for shard in manifest.shards:
        problem = verify_shard(dataset, shard, manifest)
        if problem:
            problems.append(ShardProblem(shard.path, problem))
        if on_shard is not None:
            on_shard(shard)
    return problems
