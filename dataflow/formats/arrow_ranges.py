"""Where each record batch of an Arrow shard lies, and its sha256: what lets a reader fetch one batch alone.

The writer records, beside the layout (`arrow.LAYOUT_KEY`), every record batch's byte range in the file and
the sha256 of those bytes (`RANGES_KEY`), with a sha256 over the layout and the ranges together. A reader of
a remote shard then needs only the file's head (its schema message, which holds both) and the ranges of the
batches it wants: `PartialArrowShard` checks the head against itself and the manifest's counts, and each
batch against its hash, before anything in it is used. A flipped byte costs that batch's request again (or
the whole download, where it is in the head); it is never served. The whole shard's sha256 is still checked
when its download completes, before its decoded copy is made.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from dataflow.errors import FormatError
from dataflow.formats.arrow_columns import LAYOUT_KEY, checked_columns, checked_layout, one_line

RANGES_KEY = b"dataflow.ranges"  # JSON {"batches": [[offset, length, sha256], ...], "check": sha256}
ENTRY_WIDTH = 96  # `[offset,length,"sha256"],` for offsets below 10 TB
HEAD_PREFIX = 16  # the file's 8-byte magic, the schema message's continuation marker and its length
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def ranges_width(max_batches: int) -> int:
    """The fixed width of the ranges field for a shard of at most `max_batches` record batches."""
    return 96 + ENTRY_WIDTH * max(max_batches, 1)


def ranges_text(layout_text: bytes, batches: list[list]) -> bytes:
    """The ranges field's JSON: the batches' `[offset, length, sha256]` and the check over them and the layout."""
    listed = json.dumps(batches, separators=(",", ":")).encode()
    check = hashlib.sha256(layout_text + b"\n" + listed).hexdigest()
    return b'{"batches":' + listed + b',"check":"' + check.encode() + b'"}'


def head_length(prefix: bytes) -> int:
    """The bytes before an Arrow file's first record batch (magic and schema message), from its first 16."""
    if len(prefix) < HEAD_PREFIX or prefix[:6] != b"ARROW1" or prefix[8:12] != b"\xff\xff\xff\xff":
        raise FormatError("not an Arrow IPC file (its first bytes are not an Arrow magic and schema message)")
    return HEAD_PREFIX + int.from_bytes(prefix[12:16], "little")


@dataclass(frozen=True)
class BatchRange:
    offset: int
    length: int
    sha256: str


class PartialArrowShard:
    """An Arrow shard read a record batch at a time from byte ranges: `head` is the file's first bytes (at
    least `head_length` of them), `fetch(offset, length, sha256)` gives the file's bytes there (which should
    have that sha256). Each batch's bytes are
    checked against their sha256 before they are decoded; `batch(i)` then checks what `ArrowShard.batch` checks.
    Raises `FormatError` when the head holds no ranges (written before them, or by another tool)."""

    def __init__(self, head: bytes, size: int, name: str, fetch: Callable[[int, int, str], bytes]):
        self.name, self._fetch = name, fetch
        end = head_length(head)
        if len(head) < end:
            raise FormatError(f"{name}: its head is {len(head)} bytes, its schema message needs {end}")
        self._schema_message = head[8:end]
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(self._schema_message))
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"{name}: its schema message is unreadable ({one_line(e)})") from None
        meta = schema.metadata or {}
        if RANGES_KEY not in meta or LAYOUT_KEY not in meta:
            raise FormatError(f"{name}: records no record batch ranges (written before them, or by another tool)")
        self._schema = schema
        layout = checked_layout(meta[LAYOUT_KEY], None, name)
        self.ranges = _checked_ranges(meta[LAYOUT_KEY].rstrip(b" "), meta[RANGES_KEY], len(layout), end, size, name)
        self.batch_docs = np.array([d for d, _ in layout], dtype=np.int64)
        self.batch_tokens = np.array([t for _, t in layout], dtype=np.int64)
        self.token_starts = np.concatenate([[0], np.cumsum(self.batch_tokens)])
        self.doc_starts = np.concatenate([[0], np.cumsum(self.batch_docs)])

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_starts[-1])

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """Record batch `i` as (flat tokens, document offsets into them, ids), its bytes and counts checked."""
        r = self.ranges[i]
        data = self._fetch(r.offset, r.length, r.sha256)
        if len(data) != r.length or hashlib.sha256(data).hexdigest() != r.sha256:
            raise FormatError(f"{self.name}: record batch {i}'s bytes do not match their sha256 (damaged in transit "
                              "or in the file); run `dataflow verify`")
        try:
            rb = pa.ipc.open_stream(pa.py_buffer(self._schema_message + data + _EOS),
                                    memory_pool=pa.system_memory_pool()).read_next_batch()  # freed when dropped
        except (pa.ArrowException, OSError, StopIteration) as e:
            raise FormatError(f"{self.name}: record batch {i} is unreadable ({one_line(e)})") from None
        values, offsets, ids = checked_columns(rb, self.name, i)
        if (len(offsets) - 1, len(values)) != (self.batch_docs[i], self.batch_tokens[i]):
            raise FormatError(f"{self.name}: record batch {i} holds {len(offsets) - 1} documents / {len(values)} "
                              f"tokens, its layout says {self.batch_docs[i]} / {self.batch_tokens[i]}")
        return values, offsets, ids

    def where(self, i: int) -> str:
        return f"record batch {i}"


def _checked_ranges(layout_text: bytes, text: bytes, count: int, first: int, size: int,
                    name: str) -> list[BatchRange]:
    """The ranges field parsed and checked: its check matches the layout and ranges as written, there is one
    range per record batch, and they follow each other from the end of the schema message, inside the file."""
    bad = f"{name}: its record batch ranges ({RANGES_KEY.decode()} in the schema metadata) are damaged"
    try:
        field = json.loads(text)
        batches = field["batches"]
        ok = ranges_text(layout_text, batches) == text.rstrip(b" ") and len(batches) == count
    except (ValueError, KeyError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise FormatError(bad)
    out, at = [], first
    for offset, length, digest in batches:
        if offset != at or not isinstance(length, int) or length <= 0 or not isinstance(digest, str):
            raise FormatError(bad)
        out.append(BatchRange(offset, length, digest))
        at = offset + length
    if at > size:
        raise FormatError(f"{bad}: they reach past the file's {size} bytes")
    return out
