"""Where shard bytes come from: the dataset folder itself when local, else a local cache.

Remote shards (any fsspec URL) are downloaded once into `cache_dir`, checked against the manifest's
sha256 and renamed into place, so no reader ever sees a partial file. Processes on one machine share
the cache safely: a per-shard lock file means one download per shard, the others wait and reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import posixpath
import tempfile
import time

import fsspec

from dataflow.errors import DataflowError, FormatError
from dataflow.formats.manifest import ShardInfo

RETRIES = 5


def is_remote(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def default_cache_dir() -> str:
    return os.environ.get("DATAFLOW_CACHE", os.path.join(tempfile.gettempdir(), "dataflow-cache"))


class Storage:
    """Resolves a manifest's shard to a local file path, downloading into the cache if needed."""

    def __init__(self, root: str, cache_dir: str | None = None):
        self.root = root[len("file://"):] if root.startswith("file://") else root
        self.remote = is_remote(self.root)
        self.cache_root = None
        if self.remote:
            tag = hashlib.sha256(self.root.rstrip("/").encode()).hexdigest()[:16]
            self.cache_root = os.path.join(cache_dir or default_cache_dir(), tag)
        self.downloads = 0  # shards this process fetched (tests count them)

    def local_path(self, shard: ShardInfo) -> str:
        if not self.remote:
            return os.path.join(self.root, shard.path)
        path = os.path.join(self.cache_root, shard.path)
        if _complete(path, shard):
            return path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one download per shard across processes
            if not _complete(path, shard):
                self._download(shard, path)
        return path

    def _download(self, shard: ShardInfo, path: str) -> None:
        url = posixpath.join(self.root.rstrip("/"), shard.path)
        for attempt in range(RETRIES):
            tmp = f"{path}.{os.getpid()}.part"
            try:
                h = hashlib.sha256()
                with fsspec.open(url, "rb") as src, open(tmp, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        dst.write(chunk)
                if h.hexdigest() != shard.sha256:
                    raise FormatError(f"{url}: downloaded bytes do not match the manifest's sha256")
                os.replace(tmp, path)
                self.downloads += 1
                return
            except FileNotFoundError:
                raise DataflowError(f"{url}: shard listed in the manifest is missing") from None
            except (OSError, FormatError) as e:
                if attempt == RETRIES - 1:
                    raise DataflowError(f"{url}: download failed after {RETRIES} attempts ({e})") from None
                time.sleep(min(0.2 * 2 ** attempt, 5.0))
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)


def _complete(path: str, shard: ShardInfo) -> bool:
    try:
        return os.path.getsize(path) == shard.bytes
    except OSError:
        return False
