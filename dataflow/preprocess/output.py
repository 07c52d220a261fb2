"""Where a tokenize run puts its dataset: a local folder, or any fsspec URL (`s3://`, `gs://`, ...).

A local folder gets its shards by rename from the run's scratch folder, in input order, and keeps the
journal and the run lock in `OUT/_work/`. An object store has no rename and no `flock`: there each worker
uploads its shards straight to final names derived from its bundle (`shard-UNIT-PIECE-K`), the manifest
written at the end is the commit point (a reader sees no dataset before it), and the journal, the run lock
and the error log live in a local work folder under the cache (`$DATAFLOW_CACHE/tokenize-work/...`, one
per output URL): a rerun must start on the same machine to resume. A resume removes the shards an
interrupted run uploaded that no journal lists.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import replace

import fsspec

from dataflow.errors import ConfigError, CredentialsError, UnreachableError, cause
from dataflow.formats import remote
from dataflow.formats.manifest import Manifest, ShardInfo, manifest_url
from dataflow.formats.remote_errors import explain


def join(base: str, name: str) -> str:
    return posixpath.join(base.rstrip("/"), name) if remote.is_remote(base) else os.path.join(base, name)


def local_work_root(out: str) -> str:
    """The local work folder of a run writing to the URL `out`."""
    from dataflow.env import cache_dir as default_cache_dir

    return os.path.join(default_cache_dir(), "tokenize-work", hashlib.sha256(out.encode()).hexdigest()[:16])


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


def check_reachable(out: str) -> None:
    """One request to the object store before anything starts: an unreachable endpoint, missing or refused
    credentials, or a bucket that does not exist is one line naming `out` (not a traceback from a worker's
    first upload)."""
    fs, path = fsspec.core.url_to_fs(out)
    bucket = path.split("/", 1)[0]
    try:
        fs.info(bucket)  # one request (`exists` answers False for every failure)
    except FileNotFoundError:
        raise ConfigError(f"{out}: the bucket {bucket!r} does not exist; create it, or write elsewhere with "
                          f"another -o") from None
    except Exception as e:  # noqa: BLE001  (each backend raises its own types)
        known = explain(out, e)
        if isinstance(known, (CredentialsError, UnreachableError)):
            raise known from cause(e)
        # anything else (a key allowed to write but not to look at the bucket) is for the uploads to say


def final_name(scratch_name: str, split: str) -> str:
    """A shard's name in an object store, from its scratch name (`unit-UNIT-PIECE-SPLIT-K.ext`): its bundle's."""
    return "shard-" + scratch_name[len("unit-"):].replace(f"-{split}-", "-", 1)


def upload_shards(scratch: str, shards: list[ShardInfo], split_url: str, split: str) -> list[ShardInfo]:
    """Put a worker's finished shards at their final names under `split_url` (then drop the local copies)."""
    fs, root = fsspec.core.url_to_fs(split_url)
    placed = []
    for shard in shards:
        name = final_name(shard.path, split)
        local = os.path.join(scratch, shard.path)
        fs.put_file(local, posixpath.join(root, name))
        os.remove(local)
        placed.append(replace(shard, path=name))
    return placed


def remove_shards(split_url: str, keep: set[str] = frozenset(), also: tuple[str, ...] = ()) -> None:
    """Delete the `shard-*` objects under `split_url` not in `keep` (and the names in `also`)."""
    fs, root = fsspec.core.url_to_fs(split_url)
    try:
        names = [posixpath.basename(p) for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return
    for name in names:
        if (name.startswith("shard-") and name not in keep) or name in also:
            fs.rm(posixpath.join(root, name))


def put_file(local: str, url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.put_file(local, path)


def write_remote_manifest(split_url: str, manifest: Manifest) -> None:
    """The manifest: the commit point of a dataset in an object store (one PUT: all of it or nothing)."""
    manifest.validate(split_url)
    with fsspec.open(manifest_url(split_url), "w") as f:
        json.dump(manifest.to_dict(), f, indent=1)
        f.write("\n")
