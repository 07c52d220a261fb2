"""Token access inside shards for the loader: runs of tokens and documents, a record batch at a time.

Arrow shards are opened from the footer alone; a record batch is decompressed (zstd) or mapped
(uncompressed) on first use and kept until the loader moves past its shuffle window. Tar shards have
no random access, so a tar shard is parsed once, whole (memory-mapped when plain, decompressed when
`.tar.zst`), and each of its documents is a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.errors import FormatError
from dataflow.formats.arrow import SOURCE_KEY, ArrowShard
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.reader import check_tokens
from dataflow.formats.tar import parse_tar_shard, read_tar_stream


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
    decompressed no further than its manifest entry allows.
    """

    def __init__(self, path: str, fmt: str, info: ShardInfo, vocab_size: int, dtype: str,
                 decoded_from: str | None = None, name: str | None = None):
        self.path, self.name = path, name or path  # the file read; the shard as the user knows it
        self.vocab_size, self.dtype = vocab_size, np.dtype(dtype)
        self.batches: dict[int, Batch] = {}
        if fmt == "arrow":
            self._arrow: ArrowShard | None = ArrowShard(path, self.name)
            if decoded_from is not None and self._arrow.metadata(SOURCE_KEY) != decoded_from:
                raise FormatError(f"{path}: this decoded copy is not of the shard the manifest names ({self.name}, "
                                  f"sha256 {decoded_from[:12]}...); delete it and it is decoded again")
            info.check_holds(self.name, self._arrow.num_documents, self._arrow.num_tokens)
            self.token_starts = self._arrow.token_starts
            self.doc_starts = self._arrow.doc_starts
        else:  # each document is a batch: views into the (memory-mapped, when plain) tar stream
            self._arrow = None
            data = read_tar_stream(path, info, self.dtype.itemsize, self.name)
            self._ids, self._docs = parse_tar_shard(data, self.name, info, self.dtype)
            lengths = np.array([len(d) for d in self._docs], dtype=np.int64)
            self.token_starts = np.concatenate([[0], np.cumsum(lengths)])
            self.doc_starts = np.arange(len(self._docs) + 1, dtype=np.int64)

    def batch(self, i: int) -> Batch:
        b = self.batches.get(i)
        if b is None:
            if self._arrow is not None:
                b, where = Batch(*self._arrow.batch(i)), f"record batch {i}"
            else:
                doc = self._docs[i]
                b, where = Batch(doc, np.array([0, len(doc)], dtype=np.int64), self._ids[i:i + 1]), \
                    f"document {self._ids[i]!r}"
            check_tokens(self.name, where, b.tokens, self.dtype, self.vocab_size)
            self.batches[i] = b
        return b

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

