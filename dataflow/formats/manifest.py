"""The dataset manifest (`index.json`): schema, validation and atomic write.

A manifest is the single source of truth for a dataset: the loader plans a whole epoch from it
without opening a shard, and `verify` checks every shard against it.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec

from dataflow.errors import FormatError
from dataflow.formats.atomic import write_json_atomic

FORMAT_VERSION = 1
MANIFEST_NAME = "index.json"
FORMATS = ("arrow", "tar")
COMPRESSIONS = ("zstd", "none")
TOKENIZER_KINDS = ("bytes", "hf", "tiktoken")


@dataclass
class TokenizerMeta:
    """What a reader needs to know about the tokenizer: ids, EOS, and where its file is."""

    kind: str  # "bytes" | "hf" | "tiktoken"
    name: str
    vocab_size: int
    eos_id: int
    sha256: str | None = None  # of the tokenizer file; None for the built-in byte tokenizer
    file: str | None = None  # the copy inside the dataset folder, relative to it

    @property
    def dtype(self) -> str:
        return "uint16" if self.vocab_size <= 65536 else "uint32"


@dataclass
class ShardInfo:
    path: str  # relative to the dataset folder
    documents: int
    tokens: int
    bytes: int  # size of the file on disk
    sha256: str


@dataclass
class Manifest:
    tokenizer: TokenizerMeta
    format: str = "arrow"
    compression: str = "zstd"
    dtype: str = "uint16"
    shards: list[ShardInfo] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "tokenizer": asdict(self.tokenizer),
            "dtype": self.dtype,
            "format": self.format,
            "compression": self.compression,
            "totals": {"documents": self.documents, "tokens": self.tokens, "bytes": self.bytes,
                       "shards": len(self.shards)},
            "shards": [asdict(s) for s in self.shards],
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "manifest") -> "Manifest":
        try:
            version = int(d["version"])
            if version > FORMAT_VERSION:
                raise FormatError(f"{where}: format version {version} is newer than this dataflow "
                                  f"understands ({FORMAT_VERSION}); upgrade dataflow")
            m = cls(
                tokenizer=TokenizerMeta(**{**d["tokenizer"], "sha256": _lower(d["tokenizer"].get("sha256"))}),
                format=d["format"],
                compression=d["compression"],
                dtype=d["dtype"],
                shards=[ShardInfo(**{**s, "sha256": _lower(s.get("sha256"))}) for s in d["shards"]],
                provenance=d.get("provenance", {}),
                version=version,
            )
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{where}: not a valid dataflow manifest ({type(e).__name__}: {e})") from None
        m.validate(where)
        return m

    def validate(self, where: str = "manifest") -> None:
        """Reject what a reader must never trust: unknown formats, escaping or absolute paths, counts or
        ids out of range, hashes that are not hashes (they name files in the cache)."""
        if self.format not in FORMATS:
            raise FormatError(f"{where}: unknown shard format {self.format!r} (expected one of {FORMATS})")
        if self.compression not in COMPRESSIONS:
            raise FormatError(f"{where}: unknown compression {self.compression!r}")
        if self.dtype not in ("uint16", "uint32"):
            raise FormatError(f"{where}: unknown token dtype {self.dtype!r}")
        t = self.tokenizer
        if t.kind not in TOKENIZER_KINDS:
            raise FormatError(f"{where}: unknown tokenizer kind {t.kind!r} (expected one of {TOKENIZER_KINDS})")
        if not _count(t.vocab_size) or not 0 < t.vocab_size <= 2**32:
            raise FormatError(f"{where}: tokenizer vocab_size {t.vocab_size!r} must be an integer in [1, 2^32]")
        if not _count(t.eos_id) or t.eos_id >= t.vocab_size:
            raise FormatError(f"{where}: tokenizer eos_id {t.eos_id!r} must be an id below vocab_size {t.vocab_size}")
        if self.dtype != t.dtype:
            raise FormatError(f"{where}: token dtype {self.dtype} cannot hold a vocabulary of {t.vocab_size} "
                              f"(expected {t.dtype})")
        if t.sha256 is not None and not _is_sha256(t.sha256):
            raise FormatError(f"{where}: tokenizer sha256 {t.sha256!r} is not a sha256 hex digest")
        if t.file is not None:
            check_relative_path(t.file, where, "tokenizer file")
        seen = set()
        for s in self.shards:
            check_relative_path(s.path, where)
            if s.path in seen:
                raise FormatError(f"{where}: shard {s.path} is listed twice")
            seen.add(s.path)
            if not (_count(s.tokens) and _count(s.documents) and _count(s.bytes)):
                raise FormatError(f"{where}: shard {s.path} has counts that are not integers >= 0")
            if not _is_sha256(s.sha256):
                raise FormatError(f"{where}: shard {s.path} has sha256 {s.sha256!r}, not a sha256 hex digest")


def check_relative_path(path: str, where: str, what: str = "shard path") -> None:
    parts = path.replace("\\", "/").split("/") if isinstance(path, str) else [".."]
    if not path or path.startswith("/") or ".." in parts or ":" in parts[0]:
        raise FormatError(f"{where}: {what} {path!r} must be relative and stay inside the dataset")


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_sha256(x: Any) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def _lower(x: Any) -> Any:
    """Hex digests compare case-insensitively: keep them lowercase (they also name cache files)."""
    return x.lower() if isinstance(x, str) else x


def manifest_url(dataset: str) -> str:
    """The manifest's location for a dataset folder (local path or URL) or a direct index.json path."""
    dataset = str(dataset)
    if dataset.endswith(".json"):
        return dataset
    if "://" in dataset:
        return posixpath.join(dataset.rstrip("/"), MANIFEST_NAME)
    return os.path.join(dataset, MANIFEST_NAME)


def read_manifest(dataset: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of a dataset folder or URL."""
    url = manifest_url(dataset)
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            raw = f.read()
    except FileNotFoundError:
        folder = os.path.dirname(url)
        splits = [s for s in ("train", "val") if "://" not in url and
                  os.path.exists(os.path.join(folder, s, MANIFEST_NAME))]
        if splits:
            raise FormatError(f"{folder} holds the splits {', '.join(splits)}; pass one of them, "
                              f"e.g. {os.path.join(folder, splits[0])}") from None
        raise FormatError(f"{url}: no manifest here; is this a dataset written by `dataflow tokenize`?") from None
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"{url}: manifest is not valid JSON ({e})") from None
    return Manifest.from_dict(d, where=url)


def write_manifest(out_dir: str, manifest: Manifest) -> str:
    """Validate and write `OUT/index.json` atomically; returns its path."""
    manifest.validate(out_dir)
    path = manifest_url(out_dir)
    write_json_atomic(path, manifest.to_dict())
    return path
