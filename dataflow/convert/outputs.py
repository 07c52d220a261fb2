"""Where `dataflow convert` and `dataflow decode` write, under one rule for both.

- An output that exists is replaced only with --overwrite (an empty folder does not count). One that is not a
  regular file (a device such as /dev/full, a FIFO, a socket) is never replaced: a rename would put a file in its
  place, and the user meant none.
- An output appears whole or not at all: locally a temp file (or folder) beside it, renamed over it; at a URL
  (`s3://`, `gs://`, `memory://`, ...) staged on local disk and uploaded when whole (see `upload`). `file://PATH`
  is the local PATH: no folder named after a scheme is ever made.
- An OSError on the output (a read-only folder, one under a file, a full disk) is one line (`write_error`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from typing import Iterator

from dataflow.convert import upload
from dataflow.errors import ConfigError, DataflowError
from dataflow.formats import remote
from dataflow.formats.atomic import remove_abandoned, temp_beside
from dataflow.formats.manifest import MANIFEST_NAME

KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
         stat.S_IFSOCK: "a socket"}


def refuse_existing(paths: list[str], overwrite: bool, folder: bool = False, stdout: bool = False) -> None:
    """Refuse an output that exists unless `overwrite`, and one that is not a regular file always (a folder is
    one only where the output is a `folder`). `stdout`: the command also takes `-` for its standard output."""
    for p in paths:
        if remote.is_remote(p):
            if not overwrite and upload.exists(p):
                raise ConfigError(f"{p} exists; pass --overwrite to replace it, or write elsewhere")
            continue
        try:
            mode = os.stat(remote.local_path(p)).st_mode
        except OSError:
            continue  # not there (or under a file: the write says so)
        if stat.S_ISDIR(mode):
            if not folder:
                raise ConfigError(f"-o {p}: is a folder; pass the path of the file to write")
            if not os.listdir(remote.local_path(p)):
                continue
        elif not stat.S_ISREG(mode):
            what = KINDS.get(stat.S_IFMT(mode), "not a file")
            raise ConfigError(f"-o {p}: is {what}, not a regular file, and is never replaced; pass the path of a "
                              f"file{' (or - for standard output)' if stdout else ''}")
        if not overwrite:
            raise ConfigError(f"{p} exists; pass --overwrite to replace it, or write elsewhere")


def refuse_overlap(inputs: list[str], outputs: list[str]) -> None:
    """No output may be an input, lie inside an input folder, or hold an input (replacing it would destroy
    what is being read, --overwrite or not)."""
    for out in outputs:
        if remote.is_remote(out):
            continue  # the inputs are local files
        o = os.path.realpath(remote.local_path(out))
        for src in inputs:
            i = os.path.realpath(remote.local_path(src))
            if os.path.commonpath([i, o]) in (i, o):
                raise ConfigError(f"-o {out}: is, holds or lies inside the input {src}; write elsewhere")


@contextlib.contextmanager
def files(paths: list[str], overwrite: bool, stdout: bool = False) -> Iterator[list[str]]:
    """Checked outputs (`refuse_existing`): the local paths to write them at, each atomically (the caller's temp
    and rename). For URLs, paths in a staging folder, uploaded in order when the body succeeds."""
    refuse_existing(paths, overwrite, stdout=stdout)
    if not any(remote.is_remote(p) for p in paths):
        yield [remote.local_path(p) for p in paths]
        return
    with upload.staged_files(paths) as staged:
        yield staged


@contextlib.contextmanager
def dataset_output(out: str, overwrite: bool) -> Iterator[str]:
    """A temp folder to write the dataset into; when the `with` body succeeds it becomes `out` (renamed over a
    local folder, uploaded to a URL: `upload.staged_dataset`), when it fails it is removed: `out` holds the old
    dataset or the whole new one, never part of one. A local folder must be empty or hold a dataset."""
    if remote.is_remote(out):
        with upload.staged_dataset(out, overwrite) as tmp:
            yield tmp
        return
    out = remote.local_path(out)
    refuse_existing([out], overwrite, folder=True)
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MANIFEST_NAME)):
        raise ConfigError(f"-o {out}: a folder that holds no dataset; --overwrite replaces a dataset, not other "
                          f"files: pass a new or empty folder")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    remove_abandoned(parent, "." + os.path.basename(os.path.abspath(out)) + ".", ".old")  # a killed swap's
    tmp, held = temp_beside(out, folder=True)  # (and a killed run's temp is removed)
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a dataset is meant to be shared
        _replace(tmp, out, parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(held)


def _replace(tmp: str, out: str, parent: str) -> None:
    """Rename the folder `tmp` over `out` (an old dataset, an empty folder, a file, or nothing)."""
    old, held = None, None
    if os.path.isdir(out) and os.listdir(out):
        old, held = temp_beside(out, suffix=".old", folder=True)  # (a run killed here left one: it goes)
        os.replace(out, os.path.join(old, "dataset"))
    elif os.path.isdir(out):
        os.rmdir(out)  # empty
    elif os.path.exists(out):
        os.remove(out)  # a file, replaced with --overwrite
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if held is not None:
        os.close(held)


def write_error(e: OSError, out: str) -> DataflowError | None:
    """One line for an OSError about the output `out` (a read-only folder, a folder that is a file, a full
    disk); None for one about another file (an input's error stays the input's)."""
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)  # a write's error: a file's name comes only with open's
    if remote.is_remote(out) or not (_about(e, remote.local_path(out)) or (full and not e.filename)):
        return None
    if full:
        return DataflowError(f"-o {out}: the disk is full ({e.strerror}); free space, then rerun (what was at "
                             f"{out} is untouched)")
    return ConfigError(f"-o {out}: cannot write there ({e.strerror}); choose another path")


def _about(e: OSError, out: str) -> bool:
    """Whether `e` names the output: `out` itself, something under it, a folder above it, or a temp file the
    atomic write made beside it (`.NAME.*`)."""
    target = os.path.abspath(out)
    for f in (e.filename, e.filename2):
        if not f:
            continue
        path = os.path.abspath(os.fsdecode(f))
        beside = os.path.dirname(path) == os.path.dirname(target) and \
            os.path.basename(path).startswith("." + os.path.basename(target) + ".")
        if path == target or path.startswith(target + os.sep) or target.startswith(path + os.sep) or beside:
            return True
    return False
