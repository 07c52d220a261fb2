"""Token access inside shards for the loader: runs of tokens and documents, a record batch at a time.

A shard is opened and checked by its format (`formats.shard_formats.CheckedShard`): an Arrow shard from its
footer alone, a record batch decompressed (zstd) or mapped (uncompressed) on first use and kept until the
loader moves past its shuffle window; a tar shard, which has no random access, parsed once, whole
(memory-mapped when plain, decompressed when `.tar.zst`), each of its documents a batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dataflow.errors import FormatError
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.shard_formats import CheckedShard, ShardContents

log = logging.getLogger(__name__)
RANGED_BATCHES_KEPT = 32  # record batches a shard read by ranges keeps in memory (~16 MB of uint16)


@dataclass
class Ranged:
    """A remote shard read by ranges until its whole copy is here: `contents` serves its record batches,
    `ready()` says the whole copy can be read without waiting, `whole()` opens it (waiting for it)."""

    contents: ShardContents
    ready: Callable[[], bool]
    whole: Callable[[], CheckedShard]


@dataclass
class Batch:
    tokens: np.ndarray  # flat tokens of the record batch
    doc_offsets: np.ndarray  # document boundaries into `tokens` (len = documents + 1)
    ids: object = None  # a pyarrow string array or a list: turned into Python only when asked for


class OpenShard:
    """One shard's layout (from its footer) and the record batches loaded so far.

    A shard is checked once, when it is opened, against its manifest entry (documents and tokens: a
    reader that trusted the manifest would serve part of a shard, or reach past its end); a tar shard is
    parsed whole by `parse_tar_shard`, the definition of a valid tar shard that `verify` and `decode` use
    too. Every record batch is checked as it is loaded: its token type must be the manifest's, and every
    id below the vocabulary, so a damaged shard stops the loader with the shard's name (`name`, never the
    cache's decoded copy) instead of feeding the model ids it cannot embed. A compressed tar shard is
    decompressed no further than its manifest entry allows. `decoded_from`: the sha256 of the shard a
    decoded copy must say it came from (an Arrow copy records it).
    """

    def __init__(self, path: str, fmt: str, info: ShardInfo, vocab_size: int, dtype: str,
                 decoded_from: str | None = None, name: str | None = None, ranged: Ranged | None = None):
        self._shard = CheckedShard(path, fmt, info, dtype, vocab_size, name, decoded_from,
                                   contents=ranged.contents if ranged else None)
        self._ranged = ranged
        self.path, self.name = path, self._shard.name  # the file read; the shard as the user knows it
        self.token_starts, self.doc_starts = self._shard.token_starts, self._shard.doc_starts
        self.batches: dict[int, Batch] = {}

    @property
    def by_ranges(self) -> bool:
        """Whether record batches still come by ranged requests (its whole copy not here yet)."""
        return self._ranged is not None

    def batch(self, i: int) -> Batch:
        b = self.batches.get(i)
        if b is None:
            b = self.batches[i] = Batch(*self._load(i))
            if self._ranged is not None and len(self.batches) > RANGED_BATCHES_KEPT:
                del self.batches[next(iter(self.batches))]  # the oldest: memory stays bounded until the whole copy
        return b

    def _load(self, i: int) -> tuple:
        if self._ranged is not None:
            if not self._ranged.ready():
                try:
                    return self._shard.batch(i)
                except Exception as e:  # the whole copy's download retries, checks and says what is wrong
                    log.info("%s: record batch %d by range failed (%s); waiting for the whole shard", self.name, i, e)
            self._to_whole()
        return self._shard.batch(i)

    def _to_whole(self) -> None:
        """Read the whole copy from now on (waiting for it): the same layout, or the shard changed meanwhile."""
        assert self._ranged is not None
        shard = self._ranged.whole()
        self._ranged = None
        if not (np.array_equal(shard.token_starts, self.token_starts) and
                np.array_equal(shard.doc_starts, self.doc_starts)):
            raise FormatError(f"{self.name}: its record batches are not those its ranges described; the shard "
                              "changed while it was read (run `dataflow verify`)")
        self._shard, self.path = shard, shard.path
        self.batches.clear()

    def token_run(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start+length) of the shard's token stream (a view when it fits one batch)."""
        i = int(self.token_starts.searchsorted(start, side="right")) - 1
        off = start - int(self.token_starts[i])
        b = self.batches.get(i) or self.batch(i)
        if off + length <= len(b.tokens):
            return b.tokens[off:off + length]
        pieces, need = [b.tokens[off:]], length - (len(b.tokens) - off)
        while need > 0:
            i += 1
            nxt = self.batch(i).tokens
            pieces.append(nxt[:need])
            need -= len(pieces[-1])
        return np.concatenate(pieces)

    def doc_boundaries(self, start: int, length: int) -> np.ndarray:
        """Offsets (relative to `start`) of documents that begin inside (start, start+length)."""
        first = int(np.searchsorted(self.token_starts, start, side="right") - 1)
        last = int(np.searchsorted(self.token_starts, start + length - 1, side="right") - 1)
        out = []
        for i in range(first, last + 1):
            starts = self.batch(i).doc_offsets[:-1] + self.token_starts[i] - start
            out.append(starts[(starts > 0) & (starts < length)])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def document(self, k: int) -> tuple[str, np.ndarray]:
        i = int(np.searchsorted(self.doc_starts, k, side="right") - 1)
        b = self.batch(i)
        j = k - int(self.doc_starts[i])
        doc_id = b.ids[j]
        return str(doc_id.as_py() if hasattr(doc_id, "as_py") else doc_id), \
            b.tokens[b.doc_offsets[j]:b.doc_offsets[j + 1]]

