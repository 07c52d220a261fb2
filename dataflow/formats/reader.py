"""Reading whole documents back out of a dataset, whatever its shard format.

Each shard is checked as the loader checks it: its counts against its manifest entry when it is opened,
and every token's type and range against the manifest, so `decode` and `inspect --decode` never show
documents that the loader or `verify` would refuse.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np

from dataflow.errors import FormatError
from dataflow.formats.arrow import ArrowShard
from dataflow.formats.manifest import Manifest, ShardInfo
from dataflow.formats.tar import parse_tar_shard, read_tar_stream


def check_tokens(name: str, where: str, tokens: np.ndarray, dtype: np.dtype, vocab_size: int) -> None:
    """Refuse tokens of another type than the manifest's, or ids outside its vocabulary."""
    if tokens.dtype != dtype:
        raise FormatError(f"{name}: {where} holds {tokens.dtype} tokens, the manifest says {dtype}; the shard is "
                          f"not what its manifest describes (run `dataflow verify`)")
    if len(tokens) and int(tokens.max()) >= vocab_size:
        raise FormatError(f"{name}: {where} holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{vocab_size}; the shard is damaged (run `dataflow verify`, then re-create or "
                          f"re-download it)")


def iter_shard_batches(path: str, manifest: Manifest, info: ShardInfo,
                       name: str | None = None) -> Iterator[tuple[Sequence[Any], np.ndarray, np.ndarray]]:
    """(ids, tokens, document offsets into them) of one shard, checked, in stored order: an Arrow shard's
    record batches, a tar shard's documents one at a time. `name` is the shard in errors."""
    name = name or path
    dtype, vocab = np.dtype(manifest.dtype), manifest.tokenizer.vocab_size
    if manifest.format == "arrow":
        shard = ArrowShard(path, name)
        info.check_holds(name, shard.num_documents, shard.num_tokens)
        for i in range(shard.num_batches):
            values, offsets, ids = shard.batch(i)
            check_tokens(name, f"record batch {i}", values, dtype, vocab)
            yield ids, values, offsets
    else:
        ids, docs = parse_tar_shard(read_tar_stream(path, info, dtype.itemsize, name), name, info, dtype)
        for doc_id, tokens in zip(ids, docs):
            check_tokens(name, f"document {doc_id!r}", tokens, dtype, vocab)
            yield [doc_id], tokens, np.array([0, len(tokens)])


def iter_shard_documents(path: str, manifest: Manifest, info: ShardInfo,
                         name: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of one shard, in stored order; `name` is the shard in errors."""
    for ids, values, offsets in iter_shard_batches(path, manifest, info, name):
        for j, doc_id in enumerate(ids.to_pylist() if hasattr(ids, "to_pylist") else ids):
            yield doc_id, values[offsets[j]:offsets[j + 1]]


def iter_documents(dataset: str, manifest: Manifest,
                   shards: list[ShardInfo] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of a dataset, shard by shard, in stored order."""
    for shard in manifest.shards if shards is None else shards:
        yield from iter_shard_documents(os.path.join(dataset, shard.path), manifest, shard)
