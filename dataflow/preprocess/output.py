"""The object store's side of a tokenize output (any fsspec URL: `s3://`, `gs://`, ...), used by `StoreLayout`
(layout.py, where a local folder's side is `FolderLayout`), the workers and `merge`; and path helpers that take
a local path or a URL alike.

An object store has no rename and no `flock`: there each worker uploads its shards straight to final names
derived from its bundle (`shard-UNIT-PIECE-K`, `upload_shards`), each checked again before the manifest names
it (`check_uploaded`); the manifest written at the end is the commit point (a reader sees no dataset before
it), and the journal, the run lock and the error log live in a local work folder under the cache
(`$DATAFLOW_CACHE/tokenize-work/...`, one per output URL, `local_work_root`): a rerun must start on the same
machine to resume. A resume removes the shards an interrupted run uploaded that no journal lists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import shutil
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import fsspec

from dataflow.debug import cause
from dataflow.errors import ConfigError, CredentialsError, DataflowError, UnreachableError
from dataflow.formats import remote
from dataflow.formats.manifest import Manifest, ShardInfo, manifest_url
from dataflow.formats.remote_errors import explain, missing_backend


def join(base: str, name: str) -> str:
    return posixpath.join(base.rstrip("/"), name) if remote.is_remote(base) else os.path.join(base, name)


def local_work_root(out: str) -> str:
    """The local work folder (journal, run lock) of a run writing to the URL `out`: one per location, however
    it is spelled (`s3://b/ds`, `s3://b/ds/`, `s3://b//ds` are one prefix: their runs exclude each other)."""
    from dataflow.env import cache_dir as default_cache_dir

    key = location_key(out).encode()
    return os.path.join(default_cache_dir(), "tokenize-work", hashlib.sha256(key).hexdigest()[:16])


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem and path for `url`; a backend that is not installed (gcsfs for gs://, ...) is one
    line naming the extra to install."""
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise missing_backend(url, e) from cause(e)


def location_key(url: str) -> str:
    """`url` as the place it names: the backend, its endpoint (S3-compatible stores) and the path with
    repeated, trailing and `.` slashes taken out."""
    fs, path = filesystem(url)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    path = posixpath.normpath("/" + re.sub("/+", "/", path)).lstrip("/")
    return json.dumps([protocol, _endpoint(fs), path])


def _endpoint(fs: Any) -> str:
    """The endpoint an S3-compatible filesystem talks to, spelled one way (`HTTP://Host:80/` is `http://host`)."""
    given = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url") or getattr(fs, "endpoint_url", None) \
        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if not given:
        return ""
    parts = urlsplit(str(given))
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    port = f":{parts.port}" if parts.port and parts.port != default else ""
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}{port}{parts.path.rstrip('/')}"


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


def exists_any(path: str) -> bool:
    """Whether a local path (a broken link too) or a URL names something."""
    return exists(path) if remote.is_remote(path) else os.path.lexists(path)


def list_names(folder: str) -> list[str]:
    """The names directly in a local folder or under a URL prefix, as they are now (no cached listing);
    FileNotFoundError when there is none."""
    if not remote.is_remote(folder):
        return os.listdir(folder)
    fs, root = fsspec.core.url_to_fs(folder)
    return [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False, refresh=True)]


def remove(path: str) -> None:
    """Delete one file or object (gone already is fine)."""
    if not remote.is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    fs, p = fsspec.core.url_to_fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p)


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


def upload_shards(scratch: str, shards: list[ShardInfo], split_url: str,
                  split: str) -> tuple[list[ShardInfo], dict[str, str]]:
    """Put a worker's finished shards at their final names under `split_url` (then drop the local copies):
    the shards as placed, and each object's identity as the store gives it just after the upload (its ETag,
    `object_tag`), which the commit checks again before the manifest names it."""
    fs, root = fsspec.core.url_to_fs(split_url)
    placed, tags = [], {}
    for shard in shards:
        name = final_name(shard.path, split)
        local = os.path.join(scratch, shard.path)
        fs.put_file(local, posixpath.join(root, name))
        os.remove(local)
        placed.append(replace(shard, path=name))
        tags[name] = object_tag(fs.info(posixpath.join(root, name)))
    return placed, tags


def object_tag(info: dict[str, Any]) -> str:
    """What tells one upload of an object from another: the store's ETag (S3), md5 or generation (GCS),
    else nothing but the size (which the manifest holds anyway)."""
    for key in ("ETag", "etag", "md5Hash", "generation"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def check_uploaded(split_url: str, shards: list[dict[str, Any]]) -> None:
    """Before the manifest names them: every shard object is still the one this run uploaded (same size, same
    tag). Another run writing the same prefix from elsewhere replaces or removes them; its manifest and ours
    would then list shards that are missing or fail their hash."""
    fs, root = fsspec.core.url_to_fs(split_url)
    try:
        found = {posixpath.basename(i["name"].rstrip("/")): i for i in fs.ls(root, detail=True, refresh=True)}
    except FileNotFoundError:
        found = {}
    for shard in shards:
        what = _not_as_uploaded(found.get(shard["path"]), shard)
        if what:
            raise DataflowError(f"{join(split_url, shard['path'])}: {what}: another run is writing "
                                f"{split_url}; no manifest was written. Let one run write a prefix at a time, then "
                                f"rerun this command with --overwrite")


def _not_as_uploaded(info: dict[str, Any] | None, shard: dict[str, Any]) -> str | None:
    if info is None:
        return "is missing"
    if info.get("size") != shard["bytes"]:
        return f"is {info.get('size')} bytes, this run uploaded {shard['bytes']}"
    if shard.get("tag") and object_tag(info) != shard["tag"]:
        return "was replaced since this run uploaded it"
    return None


def put_file(local: str, url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.put_file(local, path)


def get_file(url: str, local: str) -> None:
    """Download `url` to `local`, atomically."""
    from dataflow.formats.atomic import atomic_open

    with fsspec.open(url, "rb") as src, atomic_open(local) as dst:
        shutil.copyfileobj(src, dst)


def write_remote_manifest(split_url: str, manifest: Manifest) -> None:
    """The manifest: the commit point of a dataset in an object store (one PUT: all of it or nothing)."""
    manifest.validate(split_url)
    with fsspec.open(manifest_url(split_url), "w") as f:
        json.dump(manifest.to_dict(), f, indent=1)
        f.write("\n")
