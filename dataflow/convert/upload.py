"""Outputs at URLs (`s3://`, `gs://`, `memory://`, ...): written whole in a local staging folder, then uploaded.

An object store has no rename, so nothing is written there until the output is complete on local disk (a failed
conversion leaves the store as it was). The upload puts the commit point last: a Megatron pair's `.idx` (the old
one removed first, so that no reader pairs a new `.bin` with an old index), a dataset's `index.json` (likewise;
the old dataset's own shards that the new one does not rewrite are removed after it). A single file is one PUT.
The staging folder is `$DATAFLOW_CACHE/convert-staging/` (the cache holds tokenize's local work for object
stores too), and needs room for the whole output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import tempfile
from typing import Any, Callable, Iterator, TypeVar

import fsspec

from dataflow.errors import ConfigError, DataflowError, StorageError, cause
from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME, read_manifest
from dataflow.formats.remote_errors import explain

T = TypeVar("T")


def on_store(url: str, doing: str, step: Callable[[], T]) -> T:
    """`step()`, its failure one line naming `url`: a missing backend, credentials, an unreachable endpoint, or
    what the store said while `doing` it."""
    try:
        return step()
    except DataflowError:
        raise
    except Exception as e:  # noqa: BLE001  (each backend raises its own types)
        raise (explain(url, e) or StorageError(f"{url}: {doing} failed ({remote.describe(e)}); check the URL "
                                               f"and the store, then rerun")) from cause(e)


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path) of `url`; a missing backend (gcsfs for gs://, ...) is one line."""
    return on_store(url, "opening it", lambda: fsspec.core.url_to_fs(url))


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return bool(on_store(url, "looking it up", lambda: fs.exists(path)))


def check_writable(url: str) -> None:
    """Before any work: the backend is installed, and (for a bucket store) the bucket is there and the
    credentials are accepted, as `tokenize -o URL` checks."""
    from dataflow.preprocess.output import check_reachable

    filesystem(url)
    on_store(url, "reaching the store", lambda: check_reachable(url))


@contextlib.contextmanager
def staging(url: str) -> Iterator[str]:
    """A private local folder to write the output for `url` into, removed afterwards whatever happens."""
    from dataflow.env import cache_dir

    parent = os.path.join(cache_dir(), "convert-staging")
    try:
        os.makedirs(parent, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="convert-", dir=parent)
    except OSError as e:
        raise ConfigError(f"{url}: cannot make a local staging folder in {parent} ({e.strerror}); point "
                          f"DATAFLOW_CACHE at a folder you can write") from None
    try:
        yield folder
    except OSError as e:
        if not str(e.filename or "").startswith(folder):
            raise
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataflowError(f"{url}: the local staging folder {parent} is full ({e.strerror}); free space "
                                f"or point DATAFLOW_CACHE elsewhere, then rerun ({url} is untouched)") from None
        raise ConfigError(f"{url}: cannot write the local staging folder {parent} ({e.strerror}); point "
                          f"DATAFLOW_CACHE at a folder you can write") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def staged_files(urls: list[str]) -> Iterator[list[str]]:
    """Local paths standing for `urls` (files of distinct names, side by side), for the body to write; uploaded
    when it succeeds, the last URL last: with several, the old object there goes first, so that the set is never
    half old, half new."""
    check_writable(urls[0])
    with staging(urls[0]) as folder:
        paths = [os.path.join(folder, posixpath.basename(u.rstrip("/"))) for u in urls]
        yield paths
        fs, last = filesystem(urls[-1])
        doing = "uploading it"
        if len(urls) > 1:
            on_store(urls[-1], "removing the old copy", lambda: _remove(fs, [last]))
            doing += f" ({urls[-1]} is not there until a rerun with --overwrite completes)"
        for local, url in zip(paths, urls):
            on_store(url, doing, lambda: fs.put_file(local, filesystem(url)[1]))


@contextlib.contextmanager
def staged_dataset(url: str, overwrite: bool) -> Iterator[str]:
    """A local folder for the body to write a whole dataset into, uploaded to `url` when it succeeds: refused
    where `url` holds other files, or a dataset and no `overwrite`."""
    check_writable(url)
    fs, root = filesystem(url)
    index = posixpath.join(root.rstrip("/"), MANIFEST_NAME)
    if on_store(url, "looking it up", lambda: fs.exists(index)):
        if not overwrite:
            raise ConfigError(f"{url} exists; pass --overwrite to replace it, or write elsewhere")
    elif on_store(url, "looking it up", lambda: _holds_files(fs, root)):
        raise ConfigError(f"-o {url}: a folder that holds no dataset; --overwrite replaces a dataset, not other "
                          f"files: pass a new or empty folder")
    old = _listed(url) if overwrite else set()
    with staging(url) as folder:
        yield folder
        new = sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, files in os.walk(folder) for n in files)
        doing = f"uploading it (there is no dataset at {url} until a rerun with --overwrite completes)"
        on_store(url, doing, lambda: _remove(fs, [index]))
        for name in [n for n in new if n != MANIFEST_NAME] + [MANIFEST_NAME]:
            target = posixpath.join(root.rstrip("/"), *name.split(os.sep))
            on_store(url, doing, lambda: fs.put_file(os.path.join(folder, name), target))
        stale = sorted(old - {n.replace(os.sep, "/") for n in new})
        on_store(url, "removing the old dataset's files", lambda: _remove(
            fs, [posixpath.join(root.rstrip("/"), n) for n in stale]))


def _listed(url: str) -> set[str]:
    """The files the dataset at `url` lists (shards, the tokenizer's copy): what replacing it removes. A manifest
    that cannot be read lists nothing: only files known to be the dataset's are ever deleted."""
    try:
        m = read_manifest(url)
    except DataflowError:
        return set()
    names = [s.path for s in m.shards] + ([m.tokenizer.file] if m.tokenizer.file else [])
    return {n for n in names if remote.escapes_dataset(n) is None and n != MANIFEST_NAME}


def _remove(fs: Any, paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(p)


def _holds_files(fs: Any, root: str) -> bool:
    try:
        return bool(fs.ls(root, detail=False))
    except (FileNotFoundError, NotADirectoryError):
        return False
