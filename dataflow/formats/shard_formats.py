"""The shard format as an interface: what every reader and writer of shards asks of Arrow and tar alike.

A `ShardFormat` names its files, writes a shard (`create`: a `ShardSink` fed a record batch at a time),
opens one checked against its manifest entry (`open`: a `ShardContents`), makes a zstd shard's uncompressed
copy (`decode`) and bounds that copy's size. `shard_format(name)` finds one by the manifest's name;
`CheckedShard` is the one way a shard is opened and checked (counts when opened, every token when read), for
the loader, `verify` and `decode` alike. The formats themselves live in `arrow.py` and `tar.py`.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from dataflow.errors import FormatError
from dataflow.formats.arrow import ARROW
from dataflow.formats.manifest import FORMATS, ShardInfo
from dataflow.formats.tar import TAR


class ShardSink(Protocol):
    """One shard being written, under a temp name until `commit` renames it into place."""

    def add(self, values: np.ndarray, offsets: np.ndarray, ids: object) -> None:
        """Documents `values[offsets[i]:offsets[i+1]]` (offsets from 0) with their ids (a string array)."""

    def commit(self) -> tuple[int, str]:
        """Finish the shard, durable and in place: (bytes, sha256)."""

    def abort(self, remove: bool = True) -> None:
        """Stop writing; drop the unfinished file unless `remove` is False."""


class ShardContents(Protocol):
    """An open shard whose counts matched its manifest entry: its documents a batch at a time (an Arrow record
    batch, a tar document), `token_starts`/`doc_starts` the offset of each batch's first token/document."""

    token_starts: np.ndarray
    doc_starts: np.ndarray

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, Sequence]:
        """Batch `i` as (flat tokens, document offsets into them, ids)."""

    def where(self, i: int) -> str:
        """Batch `i` in words, for errors ("record batch 3", "document 'doc-7'")."""


class ShardFormat(Protocol):
    """One shard format: its files, how they are written, opened and checked, decoded once, bounded."""

    name: str  # as a manifest's "format" names it

    def extension(self, compression: str) -> str:
        """The end of a shard's file name (".arrow", ".tar.zst")."""

    def batch_tokens(self) -> int:
        """Tokens a writer gathers before it hands them to the sink: an Arrow record batch; tar, the shard."""

    def create(self, path: str, dtype: str, compression: str, zstd_level: int | None,
               shard_size: int) -> ShardSink:
        """A sink writing the shard `path` of `dtype` tokens, of at most about `shard_size` bytes of them."""

    def open(self, path: str, info: ShardInfo, dtype: np.dtype, name: str,
             decoded_from: str | None = None) -> ShardContents:
        """The shard in `path` checked against its entry `info` (`name`: the shard in errors); `decoded_from`:
        the sha256 a decoded copy must say it came from (where the format records it)."""

    def decode(self, src: str, dst: str, info: ShardInfo, itemsize: int, name: str | None = None) -> int:
        """Write the uncompressed copy of the zstd shard `src` to `dst`; returns its size."""

    def decoded_bound(self, info: ShardInfo) -> int:
        """At most the bytes a decoded copy takes, whatever its tokens' type (the room a full disk lacked)."""

    def decoded_estimate(self, info: ShardInfo, itemsize: int) -> int:
        """About the bytes a decoded copy takes, from the manifest's counts (what a cache limit counts)."""


_BY_NAME: dict[str, ShardFormat] = {f.name: f for f in (ARROW, TAR)}  # FORMATS, which a manifest may name


def shard_format(name: str) -> ShardFormat:
    """The format a manifest's "format" names; anything else is a one-line `FormatError`."""
    found = _BY_NAME.get(name)
    if found is None:
        raise FormatError(f"unknown shard format {name!r}: expected one of {', '.join(FORMATS)}")
    return found


def check_tokens(name: str, where: str, tokens: np.ndarray, dtype: np.dtype, vocab_size: int) -> None:
    """Refuse tokens of another type than the manifest's, or ids outside its vocabulary."""
    if tokens.dtype != dtype:
        raise FormatError(f"{name}: {where} holds {tokens.dtype} tokens, the manifest says {dtype}; the shard is "
                          f"not what its manifest describes (run `dataflow verify`)")
    if len(tokens) and int(tokens.max()) >= vocab_size:
        raise FormatError(f"{name}: {where} holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{vocab_size}; the shard is damaged (run `dataflow verify`, then re-create or "
                          f"re-download it)")


class CheckedShard:
    """One shard opened by its format and checked: its counts against its manifest entry when opened, and each
    batch's token type and range against the manifest when read, so a damaged shard is refused with its name
    (`name`: the shard as the user knows it, never a cache's copy) wherever it is read."""

    def __init__(self, path: str, fmt: str, info: ShardInfo, dtype: str | np.dtype, vocab_size: int,
                 name: str | None = None, decoded_from: str | None = None, contents: ShardContents | None = None):
        self.path, self.name = path, name or path
        self.dtype, self.vocab_size = np.dtype(dtype), vocab_size
        if contents is None:
            contents = shard_format(fmt).open(path, info, self.dtype, self.name, decoded_from)
        else:  # opened otherwise (a remote shard read by ranges): its counts are checked here
            info.check_holds(self.name, int(contents.doc_starts[-1]), int(contents.token_starts[-1]))
        self.contents = contents
        self.token_starts, self.doc_starts = self.contents.token_starts, self.contents.doc_starts

    @property
    def num_batches(self) -> int:
        return len(self.token_starts) - 1

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, Sequence]:
        """Batch `i` as (flat tokens, document offsets into them, ids), its tokens checked."""
        values, offsets, ids = self.contents.batch(i)
        check_tokens(self.name, self.contents.where(i), values, self.dtype, self.vocab_size)
        return values, offsets, ids
