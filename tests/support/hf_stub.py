"""A local stand-in for the Hugging Face Hub's fsspec filesystem (`hf://`), counting every ranged read.

`HubStub` answers `hf://datasets/ORG/NAME/PATH` from the folder `HubStub.root` (so `root/datasets/ORG/NAME/PATH`)
and, like huggingface_hub's `HfFileSystemFile`, serves reads through fsspec's `AbstractBufferedFile`: each
`_fetch_range` is one HTTP range request on the real Hub. Each one is appended to `HubStub.log` as
`pid start end path`, so requests made in forked worker processes are counted too. `HubStub.fail` makes that
many requests of processes other than `HubStub.parent` answer 429 (Too Many Requests) first.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem


class TooManyRequests(OSError):
    """What a rate-limited request raises (the status is where aiohttp and our classifier look for it)."""

    status = 429


class HubStub(AbstractFileSystem):
    protocol = "hf"
    root_marker = ""
    cachable = False
    root = ""
    log = ""
    fail = 0
    parent = 0

    def local(self, path: str) -> str:
        return os.path.join(self.root, self._strip_protocol(path))

    def _entry(self, path: str) -> dict:
        local = self.local(path)
        kind = "directory" if os.path.isdir(local) else "file"
        return {"name": self._strip_protocol(path), "size": os.path.getsize(local) if kind == "file" else 0,
                "type": kind}

    def ls(self, path: str, detail: bool = True, **kwargs):
        path = self._strip_protocol(path)
        if not os.path.isdir(self.local(path)):
            return [self.info(path)] if detail else [path]
        out = [self._entry(f"{path}/{name}") for name in sorted(os.listdir(self.local(path)))]
        return out if detail else [o["name"] for o in out]

    def info(self, path: str, **kwargs) -> dict:
        if not os.path.exists(self.local(path)):
            raise FileNotFoundError(path)
        return self._entry(path)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        return StubFile(self, self._strip_protocol(path), mode, block_size=block_size or "default",
                        cache_options=cache_options, **kwargs)


class StubFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        with open(HubStub.log, "a") as f:
            f.write(f"{os.getpid()} {start} {end} {self.path}\n")
        if HubStub.fail > 0 and os.getpid() != HubStub.parent:
            HubStub.fail -= 1
            raise TooManyRequests(f"429 Too Many Requests for {self.path}")
        with open(self.fs.local(self.path), "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass(frozen=True)
class Request:
    pid: int
    start: int
    end: int
    path: str


def requests(log: str) -> list[Request]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [Request(int(p), int(s), int(e), path) for p, s, e, path in (line.split(" ", 3) for line in f.read()
                                                                            .splitlines())]


def install(root: str, log: str, fail: int = 0) -> None:
    """Serve `hf://` from `root` in this process and the workers it forks (undo with `uninstall`)."""
    HubStub.root, HubStub.log, HubStub.fail, HubStub.parent = root, log, fail, os.getpid()
    fsspec.register_implementation("hf", HubStub, clobber=True)


def uninstall() -> None:
    sys.modules["fsspec.registry"]._registry.pop("hf", None)  # the next hf:// URL loads the real one again
