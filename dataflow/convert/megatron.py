"""Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), read and written without Megatron itself.

The layout is megatron-core's (megatron/core/datasets/indexed_dataset.py, `_IndexWriter`):

    PREFIX.idx  b"MMIDIDX\\x00\\x00", version <Q (1), dtype code <B, sequence count S <Q, count D <Q,
                sequence lengths int32[S], sequence pointers int64[S] (byte offsets into PREFIX.bin),
                document indices int64[D]: document i is sequences [di[i], di[i+1]), so D = documents + 1;
                a multimodal dataset appends sequence modes int8[S], with no flag: the file is S bytes longer.
    PREFIX.bin  the sequences' tokens end to end, in the dtype of the code.

`IndexedDataset[i]` is a sequence; one of our documents is one Megatron *document* (its sequences laid end
to end). Both files are memory-mapped and read `DOCS_PER_READ` documents at a time: memory stays bounded.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.atomic import temp_beside

HEADER = b"MMIDIDX\x00\x00"
HEADER_BYTES = len(HEADER) + 8 + 1 + 8 + 8
# megatron-core's DType codes; floats are refused (they are not token ids)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
CODES = {np.dtype(t): c for c, t in DTYPES.items()}
UINT16_BELOW = 65_500  # Megatron's DType.optimal_dtype: uint16 below this vocabulary size, else int32
DOCS_PER_READ = 1 << 16  # documents whose index entries are read at once


def paths(prefix: str) -> tuple[str, str]:
    """(PREFIX.bin, PREFIX.idx)."""
    return prefix + ".bin", prefix + ".idx"


def strip_suffix(prefix: str) -> str:
    """`data.bin` or `data.idx` means the prefix `data`, as Megatron's `--data-path` takes it."""
    return prefix[:-4] if prefix.endswith((".bin", ".idx")) else prefix


@dataclass
class MegatronIndex:
    """A parsed, size-checked `.idx`; its arrays are memory-mapped views."""

    prefix: str
    dtype: np.dtype
    lengths: np.ndarray  # int32[S]
    pointers: np.ndarray  # int64[S]
    doc_index: np.ndarray  # int64[documents + 1]
    bin_bytes: int

    @property
    def documents(self) -> int:
        return len(self.doc_index) - 1

    @property
    def tokens(self) -> int:
        return self.bin_bytes // self.dtype.itemsize


def read_index(prefix: str) -> MegatronIndex:
    """Open PREFIX.idx and check what can be checked without reading the tokens: header, version, dtype,
    file size (a multimodal index is refused), the first and last document indices."""
    bin_path, idx_path = paths(prefix)
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such file; --from megatron takes the PREFIX of PREFIX.bin and PREFIX.idx")
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:len(HEADER)] != HEADER:
        raise FormatError(f"{idx_path}: not a Megatron index (it does not start with MMIDIDX\\x00\\x00)")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[len(HEADER):])
    if version != 1:
        raise FormatError(f"{idx_path}: index version {version}; Megatron's indexed dataset has only version 1")
    if code not in DTYPES:
        raise FormatError(f"{idx_path}: unknown dtype code {code} (Megatron's are {sorted(DTYPES)})")
    dtype = np.dtype(DTYPES[code])
    if dtype.kind == "f":
        raise FormatError(f"{idx_path}: holds {dtype.name} values, not token ids; only integer datasets convert")
    plain = HEADER_BYTES + 12 * seqs + 8 * docs
    if size == plain + seqs and seqs:
        raise FormatError(f"{idx_path}: a multimodal index (sequence modes after the document indices); "
                          f"only text token datasets convert")
    if size != plain or docs < 1:
        raise FormatError(f"{idx_path}: {size} bytes, but {seqs} sequences and {docs} document indices need "
                          f"{plain}: the index is truncated or damaged")
    mm = np.memmap(idx_path, dtype=np.uint8, mode="r") if size > HEADER_BYTES else np.zeros(HEADER_BYTES, np.uint8)
    lengths = mm[HEADER_BYTES:HEADER_BYTES + 4 * seqs].view(np.int32)
    pointers = mm[HEADER_BYTES + 4 * seqs:HEADER_BYTES + 12 * seqs].view(np.int64)
    doc_index = mm[HEADER_BYTES + 12 * seqs:plain].view(np.int64)
    if doc_index[0] != 0 or doc_index[-1] != seqs:
        raise FormatError(f"{idx_path}: document indices run from {doc_index[0]} to {doc_index[-1]}, not from 0 "
                          f"to the {seqs} sequences: the index is damaged")
    return MegatronIndex(prefix, dtype, lengths, pointers, doc_index, os.path.getsize(bin_path))


def document_batches(index: MegatronIndex, batch_tokens: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first document, tokens, offsets from 0) of consecutive documents, about `batch_tokens` tokens at a
    time (at least one document); `tokens` is a view of the memory-mapped .bin in its own dtype.

    Checks the index against the data as it goes: document indices that do not increase, negative
    lengths, sequences that are not laid end to end from the start of PREFIX.bin (as every Megatron
    writer lays them), a .bin shorter or longer than the index says."""
    bin_path, idx_path = paths(index.prefix)
    item = index.dtype.itemsize
    if index.bin_bytes % item:
        raise FormatError(f"{bin_path}: {index.bin_bytes} bytes is not a whole number of {index.dtype.name} tokens")
    data = np.memmap(bin_path, dtype=index.dtype, mode="r") if index.bin_bytes else np.zeros(0, index.dtype)
    next_token = 0  # where the next sequence must start, in tokens
    for lo in range(0, index.documents, DOCS_PER_READ):
        hi = min(lo + DOCS_PER_READ, index.documents)
        di = np.asarray(index.doc_index[lo:hi + 1])
        if np.any(np.diff(di) < 0):
            raise FormatError(f"{idx_path}: document indices decrease near document {lo}: the index is damaged")
        s0, s1 = int(di[0]), int(di[-1])
        lengths = np.asarray(index.lengths[s0:s1], dtype=np.int64)
        if lengths.size and lengths.min() < 0:
            raise FormatError(f"{idx_path}: a negative sequence length near sequence {s0}: the index is damaged")
        starts = next_token + np.concatenate([[0], np.cumsum(lengths)])  # token offset of each sequence
        bad = np.flatnonzero(np.asarray(index.pointers[s0:s1]) != starts[:-1] * item)
        if bad.size:
            raise FormatError(f"{idx_path}: sequence {s0 + int(bad[0])} does not start where the one before it "
                              f"ends; only datasets whose sequences lie end to end (as Megatron writes them) convert")
        if starts[-1] > index.tokens:
            raise FormatError(f"{bin_path}: {index.tokens} tokens, but the index needs at least {int(starts[-1])}: "
                              f"the .bin is truncated")
        doc_starts = starts[di - s0]
        yield from _split(lo, data, doc_starts, batch_tokens)
        next_token = int(starts[-1])
    if next_token != index.tokens:
        raise FormatError(f"{bin_path}: {index.tokens} tokens, but the index describes {next_token}: the .bin and "
                          f".idx do not belong together, or one is damaged")


def _split(first: int, data: np.ndarray, doc_starts: np.ndarray,
           batch_tokens: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Cut documents `first...` (token starts `doc_starts`, one more than documents) into batches."""
    i, n = 0, len(doc_starts) - 1
    while i < n:
        j = int(np.searchsorted(doc_starts, doc_starts[i] + batch_tokens, side="right")) - 1
        j = min(max(j, i + 1), n)
        t0, t1 = int(doc_starts[i]), int(doc_starts[j])
        yield first + i, data[t0:t1], doc_starts[i:j + 1] - t0
        i = j


def output_dtype(vocab_size: int) -> np.dtype:
    """What Megatron's preprocess_data.py picks: uint16 below 65,500 ids, else int32 (it has no uint32)."""
    if vocab_size > np.iinfo(np.int32).max + 1:
        raise ConfigError(f"a vocabulary of {vocab_size} ids does not fit Megatron's int32 tokens")
    return np.dtype(np.uint16 if vocab_size < UINT16_BELOW else np.int32)


class MegatronWriter:
    """Writes PREFIX.bin and PREFIX.idx: one sequence per document, document indices 0..N.

    The number of documents is known up front (from the manifests), so the index is written in place as
    the documents stream through: lengths and pointers at their offsets, nothing held in memory. Both
    files are temp files beside their targets until `commit()` renames them (the .idx last, so a reader
    never pairs a new .bin with an old .idx).
    """

    def __init__(self, prefix: str, dtype: np.dtype, documents: int):
        self.prefix, self.dtype, self.documents = prefix, np.dtype(dtype), documents
        folder = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(folder, exist_ok=True)
        self._temps: list[str] = []
        self._held: list[int] = []  # their flocks: a rerun removes only the temps of a writer that died
        self._bin = self._temp()
        self._idx = self._temp()
        self._idx.write(HEADER + struct.pack("<QBQQ", 1, CODES[self.dtype], documents, documents + 1))
        self._written = 0  # documents
        self._bin_bytes = 0

    def _temp(self):
        path, held = temp_beside(self.prefix)
        self._temps.append(path)
        self._held.append(held)
        return os.fdopen(os.dup(held), "w+b")

    def _let_go(self) -> None:
        self._temps.clear()
        for fd in self._held:
            os.close(fd)
        self._held.clear()

    def add(self, tokens: np.ndarray, offsets: np.ndarray, ids: list[str]) -> None:
        """Documents `tokens[offsets[i]:offsets[i+1]]`, ids `ids` (for messages)."""
        lengths = np.diff(offsets)
        if self._written + len(lengths) > self.documents:
            raise FormatError(f"{self.prefix}: more documents than the manifests count ({self.documents})")
        too_long = np.flatnonzero(lengths > np.iinfo(np.int32).max)
        if too_long.size:
            raise ConfigError(f"document {ids[too_long[0]]!r} has {lengths[too_long[0]]} tokens; Megatron's "
                              f"index holds lengths as int32")
        pointers = self._bin_bytes + np.concatenate([[0], np.cumsum(lengths[:-1])]) * self.dtype.itemsize
        self._idx.seek(HEADER_BYTES + 4 * self._written)
        self._idx.write(lengths.astype(np.int32).tobytes())
        self._idx.seek(HEADER_BYTES + 4 * self.documents + 8 * self._written)
        self._idx.write(pointers.astype(np.int64).tobytes())
        data = np.ascontiguousarray(tokens, dtype=self.dtype)
        self._bin.write(memoryview(data).cast("B"))
        self._written += len(lengths)
        self._bin_bytes += data.nbytes

    def commit(self) -> None:
        """Write the document indices, make both files durable and rename them into place."""
        if self._written != self.documents:
            raise FormatError(f"{self.prefix}: {self._written} documents read, the manifests count {self.documents}")
        self._idx.seek(HEADER_BYTES + 12 * self.documents)
        for lo in range(0, self.documents + 1, 1 << 20):
            self._idx.write(np.arange(lo, min(lo + (1 << 20), self.documents + 1), dtype=np.int64).tobytes())
        bin_path, idx_path = paths(self.prefix)
        for f in (self._bin, self._idx):
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; a dataset is meant to be shared
            f.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(idx_path)  # an old index never describes the new .bin
        os.replace(self._temps[0], bin_path)
        os.replace(self._temps[1], idx_path)
        self._let_go()

    def abort(self) -> None:
        """Remove the temp files; the targets are untouched."""
        for f in (self._bin, self._idx):
            f.close()
        for path in self._temps:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        self._let_go()
