"""An Arrow shard's record batch ranges (`formats/arrow_ranges.py`): what a remote reader fetches one batch at a
time from, checked against itself and every batch against its sha256, on real documents (KJV lines)."""

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from dataflow import FormatError
from dataflow.formats import arrow
from dataflow.formats.arrow import ArrowShard, decode_arrow_shard
from dataflow.formats.arrow_ranges import RANGES_KEY, PartialArrowShard, head_length
from dataflow.formats.manifest import read_manifest
from support.loading import kjv_lines_dataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """KJV lines in zstd shards of a few dozen record batches."""
    mp = pytest.MonkeyPatch()
    mp.setattr(arrow, "RECORD_BATCH_TOKENS", 4096)
    try:
        out = kjv_lines_dataset(tmp_path_factory.mktemp("ranges") / "ds", 300_000, "200KB")
    finally:
        mp.undo()
    return [os.path.join(out, s.path) for s in read_manifest(out).shards]


def _partial(data: bytes, fetched: list | None = None, name: str = "shard") -> PartialArrowShard:
    def fetch(offset: int, length: int, sha256: str) -> bytes:
        if fetched is not None:
            fetched.append((offset, length))
        return data[offset:offset + length]
    return PartialArrowShard(data[:head_length(data[:16])], len(data), name, fetch)


def test_each_batch_read_from_its_range_is_the_batch_of_the_whole_file(shards):
    assert len(shards) >= 2
    for path in shards:
        data = open(path, "rb").read()
        whole, fetched = ArrowShard(path), []
        part = _partial(data, fetched)
        assert whole.num_batches >= 10
        np.testing.assert_array_equal(part.token_starts, whole.token_starts)
        np.testing.assert_array_equal(part.doc_starts, whole.doc_starts)
        for i in reversed(range(whole.num_batches)):  # any order: each batch needs only its own range
            got, want = part.batch(i), whole.batch(i)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
            assert got[2].equals(want[2])
        # the ranges tile the file from the schema message to the footer, one request per batch
        spans = sorted(fetched)
        assert spans[0][0] == head_length(data[:16]) and len(spans) == whole.num_batches
        assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
        for offset, length in spans:  # what the head says is each range's sha256
            assert hashlib.sha256(data[offset:offset + length]).hexdigest() in data[:head_length(data[:16])].decode(
                "latin-1")


def test_a_flipped_byte_in_a_batch_is_refused_and_the_other_batches_still_read(shards):
    data = bytearray(open(shards[0], "rb").read())
    part = _partial(bytes(data))
    r = part.ranges[3]
    data[r.offset + r.length // 2] ^= 0x01
    damaged = _partial(bytes(data))
    with pytest.raises(FormatError, match=r"shard: record batch 3's bytes do not match their sha256"):
        damaged.batch(3)
    np.testing.assert_array_equal(damaged.batch(4)[0], part.batch(4)[0])


@pytest.mark.parametrize("field", ["dataflow.batches", "dataflow.ranges"])
def test_a_flipped_digit_in_the_layout_or_the_ranges_is_refused_when_the_head_is_read(shards, field):
    data = bytearray(open(shards[0], "rb").read())
    head = bytes(data[:head_length(bytes(data[:16]))])
    at = head.index(field.encode() if field == "dataflow.ranges" else b"[[") + 40  # inside the JSON value
    while not chr(data[at]).isdigit():
        at += 1
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    with pytest.raises(FormatError, match="damaged"):
        _partial(bytes(data))


def test_a_shard_without_ranges_says_so(tmp_path):
    path = str(tmp_path / "other.arrow")
    schema = pa.schema([("tokens", pa.list_(pa.uint16())), ("id", pa.string())])
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as w:
        w.write_batch(pa.record_batch([pa.array([[1, 2]], pa.list_(pa.uint16())), pa.array(["a"])], schema=schema))
    with pytest.raises(FormatError, match="records no record batch ranges"):
        _partial(open(path, "rb").read())


def test_a_decoded_copy_keeps_the_layout_but_not_the_compressed_files_ranges(shards, tmp_path):
    copy = str(tmp_path / "copy.arrow")
    decode_arrow_shard(shards[0], copy, "ab" * 32)
    meta = pa.ipc.open_file(copy).schema.metadata
    assert RANGES_KEY not in meta and json.loads(meta[b"dataflow.batches"]) == \
        json.loads(pa.ipc.open_file(shards[0]).schema.metadata[b"dataflow.batches"])
