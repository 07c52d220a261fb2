"""Outputs at URLs (`s3://`, `gs://`, `memory://`, ...): written whole in a local staging folder, then uploaded.

An object store has no rename, so nothing is written there until the output is complete on local disk (a failed
conversion leaves the store as it was). The upload puts the commit point last: a Megatron pair's `.idx` (the old
one removed first, so that no reader pairs a new `.bin` with an old index), a dataset's `index.json` (likewise;
the old dataset's own files that the new one does not rewrite are removed after it, and a failed upload removes
what it put). A single file is one PUT. A dataset is written beside other objects, never over one that no
manifest there lists. The staging folder is `$DATAFLOW_CACHE/convert-staging/` (the cache holds tokenize's local
work for object stores too), and needs room for the whole output.
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

from dataflow.debug import cause
from dataflow.errors import ConfigError, DataflowError, StorageError
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
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)  # a write's error: a file's name comes only with open's
        if not (str(e.filename or "").startswith(folder) or (full and not e.filename)):
            raise
        if full:
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
    """A local folder for the body to write a whole dataset into, uploaded to `url` when it succeeds. A dataset
    there is replaced only with `overwrite`; other objects stay, and one that a file of the new dataset would
    replace is refused (before any upload)."""
    check_writable(url)
    fs, root = filesystem(url)
    root = root.rstrip("/")
    had = on_store(url, "looking it up", lambda: fs.exists(posixpath.join(root, MANIFEST_NAME)))
    if had and not overwrite:
        raise ConfigError(f"{url} exists; pass --overwrite to replace it, or write elsewhere")
    old = _listed(url) if had else set()
    with staging(url) as folder:
        yield folder
        new = sorted(posixpath.join(*os.path.relpath(os.path.join(d, n), folder).split(os.sep))
                     for d, _, names in os.walk(folder) for n in names)
        there = on_store(url, "listing it", lambda: _names(fs, root))
        taken = sorted(there & set(new) - old - {MANIFEST_NAME})
        if taken:
            raise ConfigError(f"{url}: {taken[0]} is there and no dataset there lists it (another program's file, "
                              f"or one an interrupted convert left); remove it, or write elsewhere")
        _upload_dataset(url, fs, root, folder, new, old)


def _upload_dataset(url: str, fs: Any, root: str, folder: str, new: list[str], old: set[str]) -> None:
    """Upload the staged dataset `new` (relative names) over the old one (`old`: what its manifest lists): the
    old manifest removed first (no reader pairs it with new shards), the new one last, then the old files that
    the new dataset does not rewrite. A failed upload removes what it put there (and, once the old manifest is
    gone, the old dataset's files): a rerun finds nothing of either."""
    put, replaced = [], False
    try:
        _remove(fs, [posixpath.join(root, MANIFEST_NAME)])
        replaced = True
        for name in [n for n in new if n != MANIFEST_NAME] + [MANIFEST_NAME]:
            put.append(posixpath.join(root, name))
            fs.put_file(os.path.join(folder, *name.split("/")), put[-1])
    except BaseException as e:
        with contextlib.suppress(Exception):  # best effort: the store may be what failed
            _remove(fs, put + ([posixpath.join(root, n) for n in old] if replaced else []))
        if not isinstance(e, Exception):
            raise
        raise (explain(url, e) or StorageError(f"{url}: uploading the dataset failed ({remote.describe(e)}); "
                                               f"{'no dataset is there now: ' if replaced else ''}check the store, "
                                               f"then rerun")) from cause(e)
    on_store(url, "removing the old dataset's files", lambda: _remove(
        fs, [posixpath.join(root, n) for n in sorted(old - set(new))]))


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


def _names(fs: Any, root: str) -> set[str]:
    """Every object under `root`, relative to it."""
    try:
        return {p[len(root):].lstrip("/") for p in fs.find(root)}
    except (FileNotFoundError, NotADirectoryError):
        return set()
