"""Atomic writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from typing import IO, Any, Iterator

from dataflow.locks import held_elsewhere, hold_open


def temp_beside(path: str, suffix: str = ".tmp", folder: bool = False) -> tuple[str, int]:
    """A new temp file (or folder) beside `path`, `.NAME.<random><suffix>`, and an fd that holds an flock on it
    while it is written (close the fd once it is renamed into place or removed). First, temps of `path` that a
    writer left when it died (killed: nothing removed them, and no one holds their lock) are removed: a rerun
    leaves no hidden copy of a 100 GB output behind."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    prefix = "." + os.path.basename(os.path.abspath(path)) + "."
    remove_abandoned(directory, prefix, suffix)
    if folder:
        tmp = tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=directory)
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    else:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    hold_open(fd)
    return tmp, fd


def remove_abandoned(directory: str, prefix: str, suffix: str) -> None:
    """Delete `directory/PREFIX*SUFFIX` temps (files or folders) whose writer is gone: their flock is free."""
    for tmp in glob.glob(os.path.join(glob.escape(directory), glob.escape(prefix) + "*" + glob.escape(suffix))):
        if held_elsewhere(tmp):
            continue  # its writer is at work
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file beside `path` (text modes in UTF-8); on clean exit fsync it and rename it over `path`."""
    tmp, held = temp_beside(path)
    try:
        with os.fdopen(os.dup(held), mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a dataset is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(held)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
