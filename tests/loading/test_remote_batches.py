"""A remote zstd Arrow shard is read a record batch at a time by ranged GETs until its whole copy is here
(issue 36 item 1): the first batch needs no whole shard, what the reader fetched the download keeps (every byte
fetched once), a damaged range is never served, and the loader's output is the local dataset's, exactly.

Real text (KJV, byte tokens) in zstd Arrow shards over moto's S3 server (127.0.0.1); the downloads are held
back at a gate (after they start, before their first request) so each test knows what has arrived."""

from __future__ import annotations

import logging
import os
import re
import threading

import pytest
import torch

from dataflow import StreamingDataLoader, StreamingDataset
from dataflow.formats import arrow, remote
from dataflow.formats.arrow_ranges import head_length
from dataflow.loading import ranged, shards
from support.loading import kjv_lines_dataset
from support.s3_server import moto_s3

SEQ, B = 127, 8
STEP = 64 << 10  # DATAFLOW_RANGE_BYTES: each shard's download is several ranges, so it keeps a reader's


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Three shards of KJV lines, record batches of 16K tokens (~10 KB as zstd)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(arrow, "RECORD_BATCH_TOKENS", 16 << 10)
    try:
        return kjv_lines_dataset(tmp_path_factory.mktemp("batches") / "ds", 3_000_000, "2MB")
    finally:
        mp.undo()


@pytest.fixture
def s3(local, tmp_path, monkeypatch):
    """(a function making the S3 dataset, the GETs made as (key, first byte, last byte), the gate the downloads
    wait at): the dataset uploaded to a fresh moto server."""
    import s3fs

    monkeypatch.setenv("DATAFLOW_RANGE_BYTES", str(STEP))
    gets: list = []
    real = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *a, **kw):
        if method == "get_object" and kw.get("Key", "").endswith(".arrow"):
            a_, b_ = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", kw["Range"]).groups()) if kw.get("Range") \
                else (0, -1)
            gets.append((kw["Key"], a_, b_))
        return await real(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    gate, arrived = threading.Event(), threading.Semaphore(0)
    started = ranged.RangedReads.started

    def held(self, entry, part):
        started(self, entry, part)  # registered: what a reader fetches from now on is kept in the part file
        arrived.release()
        gate.wait(60)

    monkeypatch.setattr(ranged.RangedReads, "started", held)
    with moto_s3("batches") as (endpoint, client):
        for name in os.listdir(local):
            client.upload_file(os.path.join(local, name), "batches", f"ds/{name}")

        def make(**kw):
            return StreamingDataset("s3://batches/ds", seq_len=SEQ, seed=1, cache_dir=str(tmp_path / "c"),
                                    storage_options={"client_kwargs": {"endpoint_url": endpoint}}, **kw)

        try:
            yield make, gets, gate, arrived
        finally:
            gate.set()


def _batches(ds):
    return [b["input_ids"] for b in StreamingDataLoader(ds, batch_size=B)]


def test_a_whole_epoch_is_served_by_ranges_while_no_download_has_arrived(local, s3):
    make, gets, gate, arrived = s3
    ds = make()
    assert len(ds.shards) == 3 and min(s.bytes for _, s in ds.shards) > 4 * STEP
    want = _batches(StreamingDataset(local, seq_len=SEQ, seed=1))
    got, kept = [], 0
    for batch in StreamingDataLoader(ds, batch_size=B):
        got.append(batch["input_ids"])
        kept = max([kept] + [len(s.batches) for s in ds.reader._open.values()])
        assert all(s.by_ranges for s in ds.reader._open.values())  # nothing whole yet: the gate is closed
    assert not gate.is_set() and len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert 0 < kept <= shards.RANGED_BATCHES_KEPT  # memory stays bounded meanwhile
    gate.set()  # the downloads may go on: closing waits for them
    ds.close()


def test_what_a_reader_fetched_its_shards_download_does_not_fetch_again(local, s3):
    make, gets, gate, arrived = s3
    ds = make()
    storage = ds.storages[0]
    storage.fetch_ahead([info for _, info in ds.shards], decode=("arrow", 2))  # what the loader starts first
    for _ in ds.shards:  # every download started, at the gate: a reader's ranges are kept from now on
        assert arrived.acquire(timeout=60)
    it = iter(StreamingDataLoader(ds, batch_size=B))
    first = next(it)["input_ids"]
    assert torch.equal(first, _batches(StreamingDataset(local, seq_len=SEQ, seed=1))[0])
    before = list(gets)
    assert before and all(b - a + 1 <= STEP for _, a, b in before)  # a head and record batches, no shard
    gate.set()
    for _ in it:
        pass
    after, batches_first = gets[len(before):], 0
    for _, info in ds.shards:
        with open(os.path.join(local, info.path), "rb") as f:
            head = head_length(f.read(16))  # the head is fetched apart: the record batches come after it
        mine = [(a, b) for key, a, b in before if key.endswith(info.path)]
        later = [(a, b) for key, a, b in after if key.endswith(info.path)]
        kept = [r for r in mine if r[0] >= head]
        assert not [(r, q) for r in kept for q in later if q[0] <= r[1] and r[0] <= q[1]]  # not fetched again
        batches_first += len(kept)
        spans, at = sorted(mine + later), 0
        for a, b in spans:  # and with the download's own, every byte of the shard came
            assert a <= at
            at = max(at, b + 1)
        assert at == info.bytes
    assert batches_first >= B  # the first batch's record batches, at least one a sample
    ds.close()


def test_a_damaged_range_is_never_served_the_whole_shard_is(local, s3, monkeypatch, caplog):
    make, gets, gate, arrived = s3
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    real = ranged.RangedReads._get

    def flipped(self, shard, offset, length):
        data = real(self, shard, offset, length)
        return data if offset < 16384 else bytes([data[0] ^ 0xFF]) + data[1:]  # the heads whole, most batches not

    monkeypatch.setattr(ranged.RangedReads, "_get", flipped)
    gate.set()
    with caplog.at_level(logging.INFO, logger="dataflow"):
        got = _batches(make())
    want = _batches(StreamingDataset(local, seq_len=SEQ, seed=1))
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert "by range failed" in caplog.text and "do not match their sha256" in caplog.text


def test_whole_shards_only_when_asked(local, s3, monkeypatch):
    make, gets, gate, arrived = s3
    monkeypatch.setenv("DATAFLOW_WHOLE_SHARDS", "1")
    gate.set()
    ds = make()
    got = _batches(ds)
    assert all(torch.equal(a, b) for a, b in zip(got, _batches(StreamingDataset(local, seq_len=SEQ, seed=1))))
    assert all(b - a + 1 == STEP or b == info.bytes - 1 for key, a, b in gets
               for _, info in ds.shards if key.endswith(info.path))  # the download's own ranges only
    ds.close()
