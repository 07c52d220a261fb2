"""The dataset manifest (`index.json`): schema, validation and atomic write.

A manifest is the single source of truth for a dataset: the loader plans a whole epoch from it
without opening a shard, and `verify` checks every shard against it.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dataflow.debug import cause
from dataflow.errors import DataflowError, FormatError, NotADatasetError
from dataflow.formats import remote
from dataflow.formats.atomic import write_json_atomic
from dataflow.formats.manifest_bounds import MAX_DEPTH, nested_deeper, read_manifest_bytes, too_deep
from dataflow.formats.remote_errors import explain, read_failed, server_error
from dataflow.locks import held_elsewhere

FORMAT_VERSION = 1
MANIFEST_NAME = "index.json"
FORMATS = ("arrow", "tar")
COMPRESSIONS = ("zstd", "none")
TOKENIZER_KINDS = ("bytes", "hf", "tiktoken")
# The most documents, tokens or bytes a shard or a whole dataset may claim: far beyond any corpus, and small
# enough that no sum, offset or size computed from them overflows int64 (or loses precision in a float64).
MAX_COUNT = 2**53
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


SPECIAL_TOKEN_RULES = ("text", "parse")


@dataclass
class Framing:
    """How each stored document is framed (`dataflow tokenize`): the id put before its text (BOS, or None),
    the id put after it (EOS, or None), and how special-token strings inside the text were encoded: "text"
    (as the characters they are) or "parse" (as their ids). A manifest without it predates framing: no BOS,
    EOS after each document unless its settings say `eos: false`, special-token strings as text."""

    bos_id: int | None = None
    eos_id: int | None = None
    special_tokens: str = "text"


@dataclass
class TokenizerMeta:
    """What a reader needs to know about the tokenizer: ids, EOS, and where its file is."""

    kind: str  # "bytes" | "hf" | "tiktoken"
    name: str
    vocab_size: int
    eos_id: int
    sha256: str | None = None  # of the tokenizer file; None for the built-in byte tokenizer
    file: str | None = None  # the copy inside the dataset folder, relative to it
    framing: Framing | None = None  # None: a manifest of before framing was recorded (see Framing)
    repo: str | None = None  # the Hugging Face Hub repository the file is of (--tokenizer ORG/NAME), else None
    revision: str | None = None  # the commit of `repo` it is of (40 hex digits)

    def __post_init__(self) -> None:
        if isinstance(self.framing, dict):  # as read from a manifest; keys added later are ignored
            self.framing = Framing(**_known(Framing, self.framing))

    @property
    def dtype(self) -> str:
        return "uint16" if self.vocab_size <= 65536 else "uint32"

    def to_dict(self) -> dict[str, Any]:
        """As the manifest has it: the Hub's `repo` and `revision` only for a tokenizer of the Hub, so that the
        manifest of any other run is what it was before they existed."""
        d = asdict(self)
        for name in ("repo", "revision"):
            if d[name] is None:
                del d[name]
        return d


@dataclass
class ShardInfo:
    path: str  # relative to the dataset folder
    documents: int
    tokens: int
    bytes: int  # size of the file on disk
    sha256: str

    def check_holds(self, name: str, documents: int, tokens: int) -> None:
        """Refuse a shard that does not hold what this entry says (`name`: the shard as the user knows it).
        Readers check this once, when they open a shard: a reader that trusted the manifest would serve
        part of a shard, or fail later reaching past its end."""
        if (documents, tokens) != (self.documents, self.tokens):
            raise FormatError(f"{name}: holds {documents} documents / {tokens} tokens, the manifest says "
                              f"{self.documents} / {self.tokens}; the shard or its manifest entry was changed "
                              "(run `dataflow verify`, then re-create or re-download it)")


@dataclass
class Manifest:
    tokenizer: TokenizerMeta
    format: str = "arrow"
    compression: str = "zstd"
    dtype: str = "uint16"
    shards: list[ShardInfo] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    declared_totals: Any = field(default=None, compare=False, repr=False)  # `totals` as read, see totals_problem

    def totals_problem(self) -> str | None:
        """What is wrong with the `totals` the manifest was read with, or None: its documents, tokens and
        shards must be the sums of the shard entries (`bytes` is each file's size, which `verify` checks
        shard by shard). Readers recompute totals and never rely on them, so only `verify` refuses a
        mismatch: a shard list put together by hand, its totals left stale, still loads."""
        t = self.declared_totals
        if t is None:
            return None
        sums = {"documents": self.documents, "tokens": self.tokens, "shards": len(self.shards)}
        if isinstance(t, dict) and all(type(t.get(k)) is int and t[k] == v for k, v in sums.items()):
            return None
        return (f"its totals {t!r} are not the sums of its shard entries {sums}; the manifest was edited or is "
                "damaged (restore its index.json, or re-create the dataset)")

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
            "tokenizer": self.tokenizer.to_dict(),
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
                tokenizer=TokenizerMeta(**_known(TokenizerMeta, _hex_lower(d["tokenizer"]))),
                format=d["format"],
                compression=d["compression"],
                dtype=d["dtype"],
                shards=[ShardInfo(**_known(ShardInfo, _hex_lower(s))) for s in d["shards"]],
                provenance=d.get("provenance", {}),
                version=version,
            )
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FormatError(f"{where}: not a valid dataflow manifest ({type(e).__name__}: {e})") from None
        m.validate(where)
        m.declared_totals = d.get("totals")
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
        if t.framing is not None:
            _check_framing(t.framing, t.vocab_size, where)
        for name in ("repo", "revision"):
            if getattr(t, name) is not None and not isinstance(getattr(t, name), str):
                raise FormatError(f"{where}: tokenizer {name} {getattr(t, name)!r} must be null or a string")
        seen: dict[str, tuple[int, str]] = {}
        for i, s in enumerate(self.shards):
            check_relative_path(s.path, where)
            _check_listed_once(s.path, i, seen, where)
            if not all(_count(n) and n <= MAX_COUNT for n in (s.documents, s.tokens, s.bytes)):
                raise FormatError(f"{where}: shard {s.path} has counts that are not integers in [0, 2^53] "
                                  f"(documents {s.documents!r}, tokens {s.tokens!r}, bytes {s.bytes!r})")
            if not _is_sha256(s.sha256):
                raise FormatError(f"{where}: shard {s.path} has sha256 {s.sha256!r}, not a sha256 hex digest")
        for what in ("documents", "tokens", "bytes"):
            if getattr(self, what) > MAX_COUNT:
                raise FormatError(f"{where}: its shards hold {getattr(self, what):,} {what} in all, more than 2^53")


def _check_framing(f: Framing, vocab_size: int, where: str) -> None:
    """A framing's ids are ids of the tokenizer (or none), its special-token rule one of SPECIAL_TOKEN_RULES."""
    if not isinstance(f, Framing):
        raise FormatError(f"{where}: tokenizer framing {f!r} is not an object of bos_id, eos_id, special_tokens")
    for name in ("bos_id", "eos_id"):
        value = getattr(f, name)
        if value is not None and (not _count(value) or value >= vocab_size):
            raise FormatError(f"{where}: tokenizer framing {name} {value!r} must be null or an id below vocab_size "
                              f"{vocab_size}")
    if f.special_tokens not in SPECIAL_TOKEN_RULES:
        raise FormatError(f"{where}: tokenizer framing special_tokens {f.special_tokens!r} is not one of "
                          f"{SPECIAL_TOKEN_RULES}")


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The keys of `d` that `cls` has: fields added later within a format version are ignored."""
    names = _field_names(cls)
    return {k: v for k, v in d.items() if k in names}


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))  # once per class: a manifest may hold a million shard entries


def check_relative_path(path: str, where: str, what: str = "shard path") -> None:
    """Format rule 3: relative, inside the dataset, also once percent-decoded (see `remote.escapes_dataset`)."""
    escaped = remote.escapes_dataset(path)
    if escaped is not None:
        raise FormatError(f"{where}: {what} {path!r} must be relative and stay inside the dataset, but leaves it "
                          f"(read as {escaped!r}); the manifest is damaged or hostile")


def _check_listed_once(path: str, index: int, seen: dict[str, tuple[int, str]], where: str) -> None:
    """Refuse a shard listed twice, in any spelling of its path (`./x`, `a//x`): the loader would serve it twice
    an epoch. `seen`: the shards so far (entry, path as written), by normalised path. A name is never
    percent-decoded here: readers open `%41.arrow` and `A.arrow` as two files."""
    first = seen.setdefault(posixpath.normpath(path), (index, path))
    if first[0] != index:
        spelled = "" if first[1] == path else f", spelled {first[1]!r} and {path!r}"
        raise FormatError(f"{where}: lists shard {posixpath.normpath(path)} twice (entries {first[0] + 1} and "
                          f"{index + 1}{spelled}), which the loader would serve twice an epoch; the manifest is "
                          "damaged or was edited: remove one entry, or re-create the dataset")


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_sha256(x: Any) -> bool:
    return isinstance(x, str) and SHA256_HEX.fullmatch(x) is not None


def _hex_lower(d: dict[str, Any]) -> dict[str, Any]:
    """Hex digests compare case-insensitively: keep them lowercase (they also name cache files)."""
    sha = d.get("sha256")
    return {**d, "sha256": sha.lower()} if isinstance(sha, str) else d


def manifest_url(dataset: str) -> str:
    """The manifest's location for a dataset folder (local path or URL) or a direct index.json path."""
    dataset = str(dataset)
    if dataset.endswith(".json"):
        return dataset
    if "://" in dataset:
        return posixpath.join(dataset.rstrip("/"), MANIFEST_NAME)
    return os.path.join(dataset, MANIFEST_NAME)


def read_manifest(dataset: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of a dataset folder or URL.

    Raises `NotADatasetError` for a path that is not a dataset (a raw file, a folder without
    `index.json`), and the errors of `remote_errors.explain` for a missing fsspec backend, missing
    credentials or an unreachable host.
    """
    url = manifest_url(dataset)

    def read() -> bytes:
        return read_manifest_bytes(url, remote.with_timeouts(url, storage_options))

    try:
        raw = remote.with_retries(url, read) if remote.is_remote(url) else read()
    except (FileNotFoundError, NotADirectoryError) as e:
        raise _not_found(str(dataset), url, e) from cause(e)
    except DataflowError:
        raise
    except Exception as e:
        err = explain(url, e)
        if err is None and remote.is_remote(url):
            err = read_failed(url, e)  # a server's error on the manifest: one line, exit 1
        if err is None:
            raise
        raise err from cause(e)
    try:
        d = json.loads(raw)
    except RecursionError:
        raise too_deep(url) from None
    except ValueError as e:
        if posixpath.basename(url) != MANIFEST_NAME:  # e.g. a JSON-lines corpus named x.json
            raise NotADatasetError(f"{url} is not a dataflow manifest (not one JSON object); pass a folder "
                                   "made by `dataflow tokenize`") from None
        raise FormatError(f"{url}: manifest is not valid JSON ({e})") from None
    if not isinstance(d, dict) or "version" not in d:
        raise NotADatasetError(f"{url} is not a dataflow manifest (no format version); pass a folder made "
                               "by `dataflow tokenize`")
    if nested_deeper({k: v for k, v in d.items() if k != "shards"}, MAX_DEPTH):
        raise too_deep(url)
    return Manifest.from_dict(d, where=url)


def _not_found(dataset: str, url: str, e: BaseException) -> DataflowError:
    """Why `url` is not there: an unreachable host (fsspec's http reports it as not found), a raw file or a
    missing path given where a dataset is expected, a folder of splits, or a folder without a manifest."""
    if remote.is_remote(url):
        err = explain(url, e)
        if err is not None and not isinstance(err, FormatError):
            return err
        answer = server_error(e)
        if answer is not None:
            return read_failed(url, answer)
        return NotADatasetError(f"{url}: no manifest here; pass the URL of a folder made by `dataflow tokenize` "
                                "(it holds index.json)")
    path = dataset[len("file://"):] if dataset.startswith("file://") else dataset
    folder = os.path.dirname(manifest_url(path))
    make = "pass a folder made by `dataflow tokenize`"
    if os.path.isfile(path) and not path.endswith(".json"):
        return NotADatasetError(f"{path} is a file, not a dataset; {make} "
                                f"(e.g. `dataflow tokenize {path} -o DIR`, then pass DIR)")
    if not os.path.exists(folder):
        return NotADatasetError(f"{folder}: no such file or folder; {make}")
    splits = [s for s in ("train", "val") if os.path.exists(os.path.join(folder, s, MANIFEST_NAME))]
    if splits:
        paths = [os.path.join(folder, s) for s in splits]
        what = f"the splits {', '.join(splits)}; pass one of them, e.g. {' or '.join(paths)}" if len(splits) > 1 \
            else f"the split {splits[0]}, not a dataset; pass {paths[0]}"
        return NotADatasetError(f"{folder} holds {what} (`dataflow tokenize --val-fraction` writes each split as a "
                                "dataset of its own)")
    unfinished = _tokenize_in_progress(folder)
    if unfinished is not None:
        return NotADatasetError(f"{folder}: no manifest yet: {unfinished}")
    return NotADatasetError(f"{manifest_url(path)}: no manifest here; {make} (it holds {MANIFEST_NAME})")


TOKENIZE_WORK_DIR = "_work"  # where a `dataflow tokenize` run keeps its journal and lock (preprocess/layout.py)


def _tokenize_in_progress(folder: str) -> str | None:
    """What a folder without a manifest is, when `dataflow tokenize` writes it (or one of its splits): running
    now (its lock is held), or interrupted (work left, nobody holding it); None otherwise."""
    for root in (folder, os.path.dirname(os.path.abspath(folder))):
        work = os.path.join(root, TOKENIZE_WORK_DIR)
        if not os.path.isdir(work):
            continue
        locks = [os.path.join(work, n) for n in os.listdir(work) if n.endswith(".lock")]
        if any(_held(lock) for lock in locks):
            return "a `dataflow tokenize` is writing it now; wait for it to finish"
        return ("a `dataflow tokenize` writing it stopped before the end; rerun the same command to finish it "
                "(it resumes)")
    return None


def _held(lock: str) -> bool:
    """True when another process holds this lock file's flock."""
    return held_elsewhere(lock)


def write_manifest(out_dir: str, manifest: Manifest) -> str:
    """Validate and write `OUT/index.json` atomically; returns its path."""
    manifest.validate(out_dir)
    path = manifest_url(out_dir)
    write_json_atomic(path, manifest.to_dict())
    return path
