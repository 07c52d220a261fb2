"""Reading whole documents back out of a dataset, whatever its shard format.

Each shard is checked as the loader checks it: its counts against its manifest entry when it is opened,
and every token's type and range against the manifest, so `decode` and `inspect --decode` never show
documents that the loader or `verify` would refuse.

Shards are read from local files, through a `ShardFiles`: `InPlace` for a dataset folder; for a dataset at
a URL the caller passes one that downloads each shard (verified, retried) while it is read. That one lives
above this package (`loading.Storage` owns downloads, and formats/ never imports loading/): the CLI's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence

import numpy as np

from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.manifest import Manifest, ShardInfo
from dataflow.formats.shard_formats import CheckedShard


class ShardFiles(Protocol):
    """Where a dataset's shard bytes are read from, as complete local files."""

    verified: bool  # True: `local` gives only files whose size and sha256 match the manifest entry

    def name(self, shard: ShardInfo) -> str:
        """The shard as the user knows it (its path or URL), for messages."""

    def local(self, shard: ShardInfo) -> ContextManager[str]:
        """A local file holding the shard's bytes, for the duration of the `with` block."""


class InPlace:
    """The shards of a local dataset folder, read where they are (a missing one is a missing file)."""

    verified = False

    def __init__(self, dataset: str):
        self.dataset = dataset

    def name(self, shard: ShardInfo) -> str:
        return os.path.join(self.dataset, shard.path)

    @contextlib.contextmanager
    def local(self, shard: ShardInfo) -> Iterator[str]:
        yield self.name(shard)


class Fetched:
    """The shards of a dataset at a URL, each fetched whole by `fetch(shard)` (a local file whose size and
    sha256 the fetcher checked), and handed back by `done(shard)` once read; `url(shard)` names it."""

    verified = True

    def __init__(self, url: Callable[[ShardInfo], str], fetch: Callable[[ShardInfo], str],
                 done: Callable[[ShardInfo], None]):
        self.url, self.fetch, self.done = url, fetch, done

    def name(self, shard: ShardInfo) -> str:
        return self.url(shard)

    @contextlib.contextmanager
    def local(self, shard: ShardInfo) -> Iterator[str]:
        path = self.fetch(shard)
        try:
            yield path
        finally:
            self.done(shard)


def shard_files(dataset: str, files: ShardFiles | None = None) -> ShardFiles:
    """`files` when given, else the dataset's shards in place; a URL needs `files` (see the module's doc)."""
    if files is not None:
        return files
    if remote.is_remote(dataset):
        raise ConfigError(f"{dataset}: a dataset at a URL is read through downloads: pass files= (the "
                          "`dataflow` commands do), or use dataflow.StreamingDataset")
    return InPlace(dataset.removeprefix("file://"))


def iter_shard_batches(path: str, manifest: Manifest, info: ShardInfo,
                       name: str | None = None) -> Iterator[tuple[Sequence[Any], np.ndarray, np.ndarray]]:
    """(ids, tokens, document offsets into them) of one shard, checked (`CheckedShard`), in stored order: an
    Arrow shard's record batches, a tar shard's documents one at a time. `name` is the shard in errors."""
    shard = CheckedShard(path, manifest.format, info, manifest.dtype, manifest.tokenizer.vocab_size, name)
    for i in range(shard.num_batches):
        values, offsets, ids = shard.batch(i)
        yield ids, values, offsets


def iter_shard_documents(path: str, manifest: Manifest, info: ShardInfo,
                         name: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of one shard, in stored order; `name` is the shard in errors."""
    for ids, values, offsets in iter_shard_batches(path, manifest, info, name):
        for j, doc_id in enumerate(ids.to_pylist() if hasattr(ids, "to_pylist") else ids):
            yield doc_id, values[offsets[j]:offsets[j + 1]]


def iter_documents(dataset: str, manifest: Manifest, shards: list[ShardInfo] | None = None,
                   files: ShardFiles | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of a dataset, shard by shard, in stored order; `files`: where the
    shards are read from (default: in place, for a local folder)."""
    files = shard_files(dataset, files)
    for shard in manifest.shards if shards is None else shards:
        with files.local(shard) as path:
            yield from iter_shard_documents(path, manifest, shard, files.name(shard))
