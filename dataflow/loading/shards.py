"""Token access inside shards for the loader: windows and documents, a record batch at a time.

Arrow shards are opened from the footer alone; a record batch is decompressed (zstd) or mapped
(uncompressed) on first use and kept until the loader moves past its shuffle block. Tar shards have
no random access, so a tar shard is streamed once into one in-memory batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard

from dataflow.formats.arrow import ArrowShard
from dataflow.formats.tar import parse_tar_documents


@dataclass
class Batch:
    tokens: np.ndarray  # flat tokens of the record batch
    doc_offsets: np.ndarray  # document boundaries into `tokens` (len = documents + 1)
    ids: object = None  # a pyarrow string array or a list: turned into Python only when asked for


class OpenShard:
    """One shard's layout (from its footer) and the record batches loaded so far."""

    def __init__(self, path: str, fmt: str):
        self.path = path
        self.batches: dict[int, Batch] = {}
        if fmt == "arrow":
            self._arrow: ArrowShard | None = ArrowShard(path)
            self.token_starts = self._arrow.token_starts
            self.doc_starts = self._arrow.doc_starts
        else:
            self._arrow = None
            with open(path, "rb") as f:
                raw = f.read()
            if path.endswith(".zst"):
                raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
            ids, docs = parse_tar_documents(raw, path)
            lengths = [len(d) for d in docs]
            offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            flat = np.concatenate(docs) if docs else np.zeros(0, np.uint16)
            self.batches[0] = Batch(flat, offsets, ids)
            self.token_starts = np.array([0, len(flat)], dtype=np.int64)
            self.doc_starts = np.array([0, len(docs)], dtype=np.int64)

    def batch(self, i: int) -> Batch:
        b = self.batches.get(i)
        if b is None:
            b = self.batches[i] = Batch(*self._arrow.batch(i))
        return b

    def window(self, start: int, length: int) -> np.ndarray:
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
