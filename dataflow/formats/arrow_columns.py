"""What an Arrow shard's record batch and layout field must hold, checked, as numpy views of Arrow's buffers.

Shared by the reader of a whole file (`arrow.ArrowShard`) and the reader of byte ranges
(`arrow_ranges.PartialArrowShard`), so both refuse the same damage in the same words.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from dataflow.errors import FormatError
from dataflow.formats.manifest import MAX_COUNT

LAYOUT_KEY = b"dataflow.batches"  # JSON [[documents, tokens], ...] per record batch

_DTYPES = {pa.int32(): np.int32, pa.int64(): np.int64, pa.uint16(): np.uint16, pa.uint32(): np.uint32}


def checked_layout(text: bytes, batches: int | None, name: str) -> list[list[int]]:
    """The layout field parsed: a `[documents, tokens]` pair of counts per record batch (`batches` of them,
    when known), or a one-line `FormatError`."""
    try:
        layout = json.loads(text)
    except (ValueError, RecursionError):
        layout = None
    ok = isinstance(layout, list) and (batches is None or len(layout) == batches) and all(
        isinstance(p, list) and len(p) == 2 and all(_count(x) for x in p) for p in layout)
    if not ok:
        raise FormatError(f"{name}: its record batch layout ({LAYOUT_KEY.decode()} in the schema metadata) is "
                          "damaged; run `dataflow verify`, then re-create the shard")
    return layout


def checked_columns(rb: pa.RecordBatch, name: str, i: int) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Record batch `i` of the shard `name` as (flat tokens, document offsets from 0, ids), validated, no nulls."""
    try:
        rb.validate()
        col, ids = rb.column(0), rb.column(1)
        if col.null_count or ids.null_count or col.values.null_count:
            raise FormatError(f"{name}: record batch {i} holds null documents, ids or tokens")
        offsets, values = view(col.offsets), view(col.values)
    except (pa.ArrowException, OSError) as e:
        raise FormatError(f"{name}: record batch {i} is unreadable ({one_line(e)})") from None
    if offsets[0] != 0:  # a sliced array: rebase
        values = values[offsets[0]:offsets[-1]]
        offsets = offsets - offsets[0]
    return values, offsets, ids


def view(array: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of a primitive Arrow array without nulls, from its buffer: `to_numpy` imports
    pandas on first use when it is installed (1-2 s in each loader process's first batch)."""
    if array.type not in _DTYPES:  # written by another tool: Arrow's way
        return array.to_numpy(zero_copy_only=True)
    dtype = np.dtype(_DTYPES[array.type])
    data = array.buffers()[1]
    if data is None or not len(array):
        return np.zeros(0, dtype)
    return np.frombuffer(data, dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT


def one_line(e: object) -> str:
    """An Arrow message or schema on one line (Arrow's own span several)."""
    return " ".join(str(e).split())
