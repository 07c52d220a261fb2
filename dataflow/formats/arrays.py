"""Arrow arrays to and from numpy and Python lists without waking pandas.

pyarrow imports pandas (1-2 s) the first time `pa.array`, `pa.scalar` or `Array.to_numpy(zero_copy_only=False)`
is called, numpy input included, when pandas is installed. The tokenize path (coordinator and workers) builds
and reads its arrays here instead, from their buffers, so that no process of a run pays for it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

_NUMERIC = {np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32(), np.dtype(np.uint32): pa.uint32(),
            np.dtype(np.uint16): pa.uint16(), np.dtype(np.uint8): pa.uint8(), np.dtype(np.float64): pa.float64()}


def numbers(values: np.ndarray) -> pa.Array:
    """A numeric numpy array as an Arrow array of the same type (one copy at most)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(_NUMERIC[values.dtype], len(values), [None, pa.py_buffer(values)])


def _bitmap(mask: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask.astype(bool, copy=False), bitorder="little"))


def bools(mask: np.ndarray) -> pa.Array:
    """A boolean numpy array as an Arrow boolean array (filters take one)."""
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, _bitmap(mask)])


def _bits(buf: pa.Buffer | None, offset: int, length: int, default: bool) -> np.ndarray:
    if buf is None:
        return np.full(length, default, dtype=bool)
    bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
    return bits[offset:offset + length].astype(bool)


def valid_mask(array: pa.Array) -> np.ndarray:
    """Where `array` is not null, as a numpy boolean array."""
    return _bits(array.buffers()[0], array.offset, len(array), True)


def true_mask(array: pa.Array) -> np.ndarray:
    """Where a boolean Arrow array is true (null counts as false)."""
    _, data = array.buffers()[:2]
    return _bits(data, array.offset, len(array), False) & valid_mask(array)


def strings(texts: Sequence[str | None]) -> pa.Array:
    """Python strings (None: null) as an Arrow string array. Raises UnicodeEncodeError for text UTF-8
    cannot hold (a lone surrogate)."""
    encoded = [b"" if t is None else t.encode("utf-8") for t in texts]
    return _string_array(encoded, np.array([t is not None for t in texts], dtype=bool), pa.string())


def large_strings(texts: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow large_string array (no nulls)."""
    return _string_array([t.encode("utf-8") for t in texts], np.ones(len(texts), dtype=bool), pa.large_string())


def _string_array(encoded: list[bytes], valid: np.ndarray, kind: pa.DataType) -> pa.Array:
    width = np.int64 if kind == pa.large_string() else np.int32
    offsets = np.zeros(len(encoded) + 1, dtype=width)
    np.cumsum(np.fromiter(map(len, encoded), dtype=width, count=len(encoded)), out=offsets[1:])
    validity = None if valid.all() else _bitmap(valid)
    return pa.Array.from_buffers(kind, len(encoded), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def repeated(text: str, n: int) -> pa.Array:
    """`text` n times, as a string array."""
    data = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int64) * len(data)
    if offsets[-1] < 2**31:
        offsets = offsets.astype(np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def text_scalar(text: str | None) -> pa.Scalar:
    """A string scalar, for compute functions (a Python str there goes through pa.scalar)."""
    return strings([text])[0]


def lengths(texts: pa.Array) -> np.ndarray:
    """The UTF-8 byte length of each string (0 for a null), as int64."""
    width = np.int64 if pa.types.is_large_string(texts.type) or pa.types.is_large_binary(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], dtype=width)[texts.offset:texts.offset + len(texts) + 1]
    sizes = np.diff(offsets).astype(np.int64)
    return np.where(valid_mask(texts), sizes, 0) if texts.null_count else sizes
