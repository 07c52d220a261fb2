"""A zstd Arrow shard decoded once per machine: an uncompressed copy in the shared cache.

Without it, every loader worker of every rank decompresses the record batches of the shards it reads,
so decoded memory and decompression CPU grow with the number of processes. The copy sits in the
cache as `<entry>.decoded.arrow`; readers memory-map it, so the page cache holds one copy for all.
The first reader decodes under the entry's `.dl` lock while the others wait; the copy appears by an
atomic rename, so a decode killed midway leaves only a partial file, which nobody reads and the next
decoder (or the evictor) removes. The copy records the sha256 of the shard it came from.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Callable

from dataflow.errors import FormatError
from dataflow.formats.arrow import decode_arrow_shard
from dataflow.formats.hashing import sha256_file
from dataflow.formats.manifest import ShardInfo
from dataflow.loading import cache

SUFFIX = ".decoded.arrow"


def size_bound(shard: ShardInfo) -> int:
    """At most the bytes a decoded copy takes: uint32 tokens, list offsets, ids, headers."""
    return 2 * shard.tokens * 4 + shard.documents * 64 + (1 << 20)


def decode_into(path: str, shard: ShardInfo, source: Callable[[], str], check_source: bool) -> float:
    """Make `path` the decoded copy of `shard` unless another process already has; returns the seconds
    spent decoding (0.0 when it found the copy made). `source()` gives the compressed file, held by the
    caller; `check_source` hashes it first (a local file nobody has checked against the manifest)."""
    fd = cache.lock(path + ".dl", fcntl.LOCK_EX)
    try:
        if os.path.exists(path):
            return 0.0
        cache.remove_partials(path)
        src = source()
        tmp = cache.part_path(path, size_bound(shard))
        try:
            t0 = time.perf_counter()
            if check_source and sha256_file(src) != shard.sha256:
                raise FormatError(f"{src}: its sha256 does not match the manifest; the shard is damaged or was "
                                  "replaced: run `dataflow verify` on the dataset")
            decode_arrow_shard(src, tmp, shard.sha256)
            os.replace(tmp, path)
            return time.perf_counter() - t0
        finally:
            cache.remove(tmp)
    finally:
        cache.unlock(fd)
