"""A large remote shard comes as ranged GETs, a few at once, the shard needed first ahead of the rest
(issue 36 items 1-2): every byte fetched once, one GET per range (none dropped), checked against the
manifest as before; a server that ignores `Range` costs one whole GET per shard.

Real text (KJV, byte tokens) in zstd Arrow shards, over moto's S3 server and a local HTTP server (127.0.0.1)."""

from __future__ import annotations

import os
import re
import threading

import pytest
import torch

from dataflow import StreamingDataLoader, StreamingDataset
from dataflow.loading.link import Link
from dataflow.loading.storage import Storage
from dataflow.formats.manifest import read_manifest
from support.http_files import _Files, serve
from support.loading import kjv_lines_dataset
from support.s3_server import moto_s3, shard_gets

SEQ, B = 127, 8
STEP = 128 << 10  # DATAFLOW_RANGE_BYTES in these tests: a ~1 MB shard is several ranges


def _batches(ds) -> list[torch.Tensor]:
    return [b["input_ids"] for b in StreamingDataLoader(ds, batch_size=B)]


def _same(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_large_s3_shard_is_ranged_gets_each_byte_once(kjv, tmp_path, monkeypatch):
    """The download's own ranges (the reader waits for the whole shard here: `test_remote_batches.py` reads
    record batches by ranges meanwhile)."""
    monkeypatch.setenv("DATAFLOW_RANGE_BYTES", str(STEP))
    monkeypatch.setenv("DATAFLOW_WHOLE_SHARDS", "1")
    path = kjv_lines_dataset(tmp_path / "ds", 2_000_000, "4MB")  # one shard of ~1.3 MB compressed
    gets = shard_gets(monkeypatch)
    with moto_s3("ranges") as (endpoint, client):
        for name in os.listdir(path):
            client.upload_file(os.path.join(path, name), "ranges", f"ds/{name}")
        ds = StreamingDataset("s3://ranges/ds", seq_len=SEQ, seed=1, cache_dir=str(tmp_path / "c"),
                              storage_options={"client_kwargs": {"endpoint_url": endpoint}})
        size = ds.shards[0][1].bytes
        assert len(ds.shards) == 1 and size > 4 * STEP
        got = _batches(ds)
    assert _same(got, _batches(StreamingDataset(path, seq_len=SEQ, seed=1)))
    spans = sorted(tuple(map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", g).groups())) for g in gets)
    assert gets[0] == f"bytes=0-{STEP - 1}"  # the first range alone, before the others
    assert spans == [(a, min(a + STEP, size) - 1) for a in range(0, size, STEP)]  # each byte once, no whole GET


def test_a_server_that_ignores_range_costs_one_whole_get(kjv, tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_RANGE_BYTES", str(STEP))
    root = tmp_path / "srv"
    path = kjv_lines_dataset(root / "ds", 2_000_000, "4MB")
    with serve(str(root)) as (url, asked, _):  # this server answers every GET with the whole file
        ds = StreamingDataset(f"{url}/ds", seq_len=SEQ, seed=1, cache_dir=str(tmp_path / "c"))
        assert ds.shards[0][1].bytes > 4 * STEP
        got = _batches(ds)
    assert _same(got, _batches(StreamingDataset(path, seq_len=SEQ, seed=1)))
    assert sum(1 for p in asked if p.endswith(".arrow")) == 1


class _Ranged(_Files):
    """Honours `Range: bytes=A-B`; a path in `damage` gets its next ranged answer with a flipped byte, and
    each ranged answer's path, range and times are in `served`."""

    mu = threading.Lock()
    served: list = []
    damage: set = set()

    def do_GET(self):  # noqa: N802
        asked = self.headers.get("Range")
        if not asked:
            return super().do_GET()
        body = self._file_quietly()
        if body is None:
            return None
        a, b = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", asked).groups())
        part = bytearray(body[a:b + 1])
        with self.mu:
            if self.path in self.damage and a > 0:
                self.damage.discard(self.path)
                part[0] ^= 0xFF
            self.served.append((self.path, a))
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {a}-{a + len(part) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def _file_quietly(self):
        self.server.asked.append(self.path)
        full = os.path.join(self.server.root, self.path.lstrip("/"))
        if not os.path.isfile(full):
            self.send_error(404)
            return None
        with open(full, "rb") as f:
            return f.read()


def test_a_damaged_range_is_caught_by_the_shard_hash_and_fetched_again(kjv, tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_RANGE_BYTES", str(STEP))
    root = tmp_path / "srv"
    path = kjv_lines_dataset(root / "ds", 2_000_000, "4MB")
    _Ranged.served.clear()
    shard = read_manifest(path).shards[0]
    _Ranged.damage = {f"/ds/{shard.path}"}
    with serve(str(root), _Ranged) as (url, _, _), Storage(f"{url}/ds", str(tmp_path / "c")) as st:
        local = st.local_path(shard)
        with open(local, "rb") as f, open(os.path.join(path, shard.path), "rb") as g:
            assert f.read() == g.read()
        assert st.downloads == 1
    ranges = -(-shard.bytes // STEP)
    assert len(_Ranged.served) == 2 * ranges  # the whole shard again: a flipped byte fails its sha256
    leftovers = [n for _, _, names in os.walk(tmp_path / "c") for n in names if ".part-" in n]
    assert leftovers == []


def test_two_shards_fetched_ahead_at_once_ask_each_range_once(kjv, tmp_path, monkeypatch):
    """A server that is not an object store: the first ranged answer says it honours Range (whichever download
    asks first, alone; the other waits for it), then both shards come as ranges, each asked for once."""
    monkeypatch.setenv("DATAFLOW_RANGE_BYTES", str(STEP))
    root = tmp_path / "srv"
    path = kjv_lines_dataset(root / "ds", 4_000_000, "4MB")
    shards = read_manifest(path).shards[:2]
    assert len(shards) == 2 and min(s.bytes for s in shards) > 4 * STEP
    _Ranged.served.clear()
    _Ranged.damage = set()
    with serve(str(root), _Ranged) as (url, _, _), Storage(f"{url}/ds", str(tmp_path / "c"),
                                                            fetch_ahead_workers=2) as st:
        st.fetch_ahead(shards)
        for s in shards:
            with open(st.local_path(s), "rb") as f, open(os.path.join(path, s.path), "rb") as g:
                assert f.read() == g.read()
            st.release(s)
        assert st.downloads == 2
    for s in shards:
        starts = sorted(a for p, a in _Ranged.served if p.endswith(s.path))
        assert starts == list(range(0, s.bytes, STEP))


def _busy(link: Link) -> tuple[threading.Event, list]:
    """A fetch-ahead request in flight on `link` until the gate returned is set; its futures."""
    started, gate = threading.Event(), threading.Event()

    def blocker():
        started.set()
        gate.wait(10)

    busy = link.submit([blocker], (0, 0, 0))
    assert started.wait(10)
    return gate, busy


def test_queued_requests_go_in_the_order_of_need():
    """One request in flight: a later shard's requests queued first still wait for the earlier shard's."""
    link, ran = Link(1), []
    gate, busy = _busy(link)
    later = link.submit([lambda i=i: ran.append(("second", i)) for i in range(3)], (0, 1, 1))
    earlier = link.submit([lambda i=i: ran.append(("first", i)) for i in range(3)], (0, 1, 0))
    gate.set()
    for futures in (busy, later, earlier):
        link.wait(futures)
    assert ran == [("first", 0), ("first", 1), ("first", 2), ("second", 0), ("second", 1), ("second", 2)]
    link.close()


def test_a_readers_request_never_waits_behind_fetch_ahead():
    """One fetch-ahead request in flight of one allowed: the other fetch-ahead requests queue behind it, while a
    reader's own request starts at once."""
    link, ran = Link(1), []
    gate, busy = _busy(link)
    ahead = link.submit([lambda: ran.append("ahead")] * 2, (0, 1, 0))
    assert link.run([lambda: ran.append("urgent")]) == [None]  # while the blocker still runs
    assert ran == ["urgent"] and len(link._heap) == 2
    gate.set()
    link.wait(busy + ahead)
    assert ran == ["urgent", "ahead", "ahead"]
    link.close()


def test_requests_asked_one_at_a_time_by_several_readers_run_together():
    """Each request asked alone, from its own thread, right after another: all of them in flight at once (a
    thread already started but not yet serving must not count for the next request too)."""
    link = Link(1)
    together = threading.Barrier(6, timeout=10)  # fails unless all six run at the same time
    threads = [threading.Thread(target=link.run, args=([together.wait],)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not together.broken
    link.close()


def test_a_failed_request_ends_the_download_only_after_the_others_stop():
    """run() raises the first failure, with nothing of that download still running (its file may be closed)."""
    link = Link(3)
    running, done = [], []

    def slow(i):
        running.append(i)
        threading.Event().wait(0.2)
        done.append(i)

    def fail():
        raise OSError("reset")

    with pytest.raises(OSError, match="reset"):
        link.run([fail, lambda: slow(1), lambda: slow(2)])
    assert sorted(done) == sorted(running)
    link.close()
