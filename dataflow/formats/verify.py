"""`dataflow verify`: every shard checked against the manifest (checksum, size, counts, structure)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from dataflow.errors import FormatError
from dataflow.formats.hashing import sha256_file
from dataflow.formats.manifest import Manifest, ShardInfo
from dataflow.formats.arrow import ArrowShard
from dataflow.formats.tar import parse_tar_documents, read_tar_stream


@dataclass
class ShardProblem:
    path: str
    problem: str


def verify_shard(dataset: str, shard: ShardInfo, manifest: Manifest, deep: bool = True) -> str | None:
    """What is wrong with one shard, or None when it is sound. Deep checks read it as the loader does
    (the same tar parser, the same limits) and check each token's type and range."""
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
        return _check_contents(path, shard, manifest) if deep else None
    except FormatError as e:
        return str(e).removeprefix(f"{path}: ")
    except Exception as e:  # anything else a damaged file provokes is reported, and the next shard checked
        return f"unreadable ({type(e).__name__}: {e})"


def _check_contents(path: str, shard: ShardInfo, manifest: Manifest) -> str | None:
    dtype, vocab = np.dtype(manifest.dtype), manifest.tokenizer.vocab_size
    docs = tokens = 0
    for where, arrays, n_docs in _token_arrays(path, shard, manifest):
        for values in arrays:
            if values.dtype != dtype:
                return f"{where} holds {values.dtype} tokens, the manifest says {dtype}"
            if len(values) and int(values.max()) >= vocab:
                return f"{where} holds token id {int(values.max())}, outside the vocabulary of {vocab}"
            tokens += len(values)
        docs += n_docs
    if (docs, tokens) != (shard.documents, shard.tokens):
        return f"holds {docs} documents / {tokens} tokens, manifest says {shard.documents} / {shard.tokens}"
    return None


def _token_arrays(path: str, shard: ShardInfo, manifest: Manifest) -> Iterator[tuple[str, list[np.ndarray], int]]:
    """(where, token arrays, documents) of each record batch (Arrow) or of the whole tar stream."""
    if manifest.format == "arrow":
        arrow = ArrowShard(path)
        for i in range(arrow.num_batches):
            values, offsets, _ = arrow.batch(i)
            yield f"record batch {i}", [values], len(offsets) - 1
    else:
        _, docs = parse_tar_documents(read_tar_stream(path, shard, np.dtype(manifest.dtype).itemsize), path)
        yield "the tar stream", docs, len(docs)


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
