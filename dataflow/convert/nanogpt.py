"""nanoGPT's flat token file: every document's tokens end to end, uint16, with no index.

nanoGPT's `prepare.py` scripts append the EOS token after each document and write the ids as uint16;
its `train.py` reads them back with `np.memmap(path, dtype=np.uint16)`. The only document boundary is
that EOS, so reading splits at it (kept at each document's end; a trailing run without one is the last
document) and writing needs every document but the last to end with one. A vocabulary whose ids do
not fit uint16 needs uint32, which train.py does not read: such a file must say so in its name.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from dataflow.errors import ConfigError, FormatError

DTYPES = ("uint16", "uint32")
CHUNK_TOKENS = 1 << 22  # tokens scanned for EOS at a time


def file_dtype(path: str, dtype: str | None) -> np.dtype:
    """The token type of a flat file: `dtype` if given, else uint32 when its name says so, else uint16."""
    if dtype is None:
        dtype = "uint32" if "uint32" in os.path.basename(path) else "uint16"
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: nanoGPT files hold {' or '.join(DTYPES)} tokens")
    return np.dtype(dtype)


def output_dtype(path: str, vocab_size: int, dtype: str | None) -> np.dtype:
    """uint16, as train.py reads; uint32 only when asked for and named for (a vocabulary above uint16)."""
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: nanoGPT files hold {' or '.join(DTYPES)} tokens")
    named_uint32 = "uint32" in os.path.basename(path)
    if dtype == "uint16" and named_uint32:
        raise ConfigError(f"{path}: a name that says uint32 is read back as uint32 tokens; drop --dtype uint16, "
                          f"or name the file without uint32")
    if dtype is None and named_uint32:  # as `file_dtype` will read it back
        dtype = "uint32"
    if dtype == "uint32":
        if not named_uint32:
            raise ConfigError(f"{path}: a uint32 file must say so in its name (e.g. train.uint32.bin): nanoGPT's "
                              f"train.py reads every .bin as uint16 and would read this one as garbage")
        return np.dtype(np.uint32)
    if vocab_size > 1 << 16:
        raise ConfigError(f"a vocabulary of {vocab_size:,} ids does not fit nanoGPT's uint16 tokens; pass --dtype "
                          f"uint32 with an output named for it (e.g. train.uint32.bin), and read it as uint32")
    return np.dtype(np.uint16)


def document_batches(path: str, dtype: np.dtype, eos_id: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first document, tokens, offsets from 0) of the documents of a flat file, split after each EOS;
    `tokens` is a view of the memory-mapped file. Memory: a chunk of the file, or the longest document."""
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise FormatError(f"{path}: {size} bytes is not a whole number of {dtype.name} tokens: the file is "
                          f"truncated, or holds another dtype (--dtype)")
    if not size:
        return
    data = np.memmap(path, dtype=dtype, mode="r")
    start, docs = 0, 0  # the current document's first token; documents emitted
    for lo in range(0, len(data), CHUNK_TOKENS):
        ends = np.flatnonzero(data[lo:lo + CHUNK_TOKENS] == eos_id) + lo + 1
        if ends.size:
            offsets = np.concatenate([[start], ends]) - start
            yield docs, data[start:int(ends[-1])], offsets
            docs += len(ends)
            start = int(ends[-1])
    if start < len(data):  # a trailing run without EOS: the last document
        yield docs, data[start:], np.array([0, len(data) - start], dtype=np.int64)


def check_separated(tokens: np.ndarray, offsets: np.ndarray, ids: list[str], eos_id: int, first: int,
                    last: int) -> None:
    """Every document (global indices first...) but the overall `last` ends with EOS: else documents would run
    into each other in a flat file."""
    lengths = np.diff(offsets)
    ends = tokens[np.maximum(offsets[1:] - 1, 0)] if len(tokens) else np.zeros(len(lengths), tokens.dtype)
    bad = np.flatnonzero(((lengths == 0) | (ends != eos_id)) & (np.arange(first, first + len(lengths)) != last))
    if bad.size:
        raise ConfigError(f"document {ids[bad[0]]!r} does not end with EOS {eos_id}: in a flat nanoGPT file it "
                          f"would run into the next one (was it tokenized with --no-eos?); pass --eos-id N to put "
                          f"N after each document")
