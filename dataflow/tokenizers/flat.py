"""Columnar batches: texts as Arrow string arrays in, token ids as flat values + offsets out.

The tokenize hot path never makes a Python object per document or per token where an engine can avoid
it: readers hand over Arrow string arrays, engines return one uint32 array of every document's ids
and an int64 array of where each document starts (`offsets[i]:offsets[i+1]`, len(texts) + 1 entries).
"""

from __future__ import annotations

import array
import itertools
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from dataflow.formats import arrays

# The reference an engine is proven against (`tokenizers` itself, hf_reference.py): texts -> each one's ids, as lists
Reference = Callable[[list[str]], list[list[int]]]

Flat = tuple[np.ndarray, np.ndarray]  # (values uint32, offsets int64 from 0)

_U32 = "I" if array.array("I").itemsize == 4 else "L"


def scrub(text: str) -> str:
    """The text with lone surrogates replaced by U+FFFD, as tiktoken does; other text unchanged."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def arrow_texts(texts: Sequence[str] | pa.Array) -> pa.Array:
    """Texts as an Arrow string array; lone surrogates (which UTF-8 cannot hold) become U+FFFD."""
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    try:
        return arrays.large_strings(texts)  # not pa.array: it imports pandas
    except UnicodeEncodeError:
        return arrays.large_strings([scrub(t) for t in texts])


def string_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 from 0, UTF-8 bytes uint8) of a string array without nulls, without copying the text."""
    if pa.types.is_string(texts.type) or pa.types.is_binary(texts.type):
        width = np.int32
    elif pa.types.is_large_string(texts.type) or pa.types.is_large_binary(texts.type):
        width = np.int64
    else:
        raise TypeError(f"expected a string array, got {texts.type}")
    _, off_buf, data_buf = texts.buffers()
    offsets = np.frombuffer(off_buf, dtype=width)[texts.offset:texts.offset + len(texts) + 1].astype(np.int64)
    if len(offsets) == 0:
        offsets = np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data = data[offsets[0]:offsets[-1]]
    return offsets - offsets[0], data


def flat_from_lists(id_lists: Sequence[Sequence[int]]) -> Flat:
    """Lists of ids (what tiktoken and tokenizers return) as flat values + offsets, in two C loops."""
    values = np.frombuffer(array.array(_U32, itertools.chain.from_iterable(id_lists)), dtype=np.uint32)
    offsets = np.zeros(len(id_lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists)), out=offsets[1:])
    return values, offsets


def split_flat(flat: Flat) -> list[np.ndarray]:
    """One array per document (for callers of the per-document API)."""
    values, offsets = flat
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def append_eos(flat: Flat, eos_id: int | None, dtype: str) -> Flat:
    """Values cast to `dtype` with `eos_id` after each document (none when eos_id is None)."""
    return frame(flat, None, eos_id, dtype)


def frame(flat: Flat, bos_id: int | None, eos_id: int | None, dtype: str) -> Flat:
    """Values cast to `dtype`, each document with `bos_id` before it and `eos_id` after it (either None: none),
    in a few whole-array numpy operations."""
    values, offsets = flat
    added = (bos_id is not None) + (eos_id is not None)
    if not added:
        return values.astype(dtype, copy=False), offsets
    docs = len(offsets) - 1
    new_offsets = offsets + added * np.arange(docs + 1, dtype=np.int64)
    out = np.empty(values.size + added * docs, dtype=dtype)
    is_text = np.ones(out.size, dtype=bool)
    if bos_id is not None:
        out[new_offsets[:-1]] = bos_id
        is_text[new_offsets[:-1]] = False
    if eos_id is not None:
        out[new_offsets[1:] - 1] = eos_id
        is_text[new_offsets[1:] - 1] = False
    out[is_text] = values
    return out, new_offsets


def replace_documents(flat: Flat, rows: np.ndarray, new: Flat) -> Flat:
    """`flat` with the documents at `rows` (increasing indices) replaced by those of `new`, in order."""
    values, offsets = flat
    lengths = np.diff(offsets)
    replaced = np.zeros(lengths.size, dtype=bool)
    replaced[rows] = True
    new_lengths = lengths.copy()
    new_lengths[rows] = np.diff(new[1])
    out_offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(new_lengths, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=np.result_type(values.dtype, new[0].dtype))
    from_new = np.repeat(replaced, new_lengths)
    out[from_new] = new[0]
    out[~from_new] = values[np.repeat(~replaced, lengths)]
    return out, out_offsets
