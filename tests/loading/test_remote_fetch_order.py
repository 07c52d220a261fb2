"""Remote shards are fetched in the order of need, one GET each: the current shuffle window gets the link before
the next one starts, and a shard larger than s3fs's block size is one GET (not a dropped whole GET, then ranges).

Real text (KJV, byte tokens) in zstd Arrow shards, over HTTP (`http_files`) and moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import threading
import time

import torch

from dataflow import StreamingDataLoader, StreamingDataset
from support.http_files import _Files, serve
from support.loading import kjv_lines_dataset
from support.s3_server import moto_s3, shard_gets

SEQ, B = 127, 8


class _Slow(_Files):
    """Each answer takes 0.15 s more (a round trip on a slow link); when each began and ended is in `spans`."""

    mu = threading.Lock()
    spans: list = []

    def do_GET(self):  # noqa: N802
        t0 = time.monotonic()
        time.sleep(0.15)
        super().do_GET()
        with self.mu:
            self.spans.append((self.path, t0, time.monotonic()))


def test_the_current_window_is_fetched_before_the_next_starts(kjv, tmp_path):
    root = tmp_path / "srv"
    kjv_lines_dataset(root / "ds", 600_000, "64KB")
    _Slow.spans.clear()
    with serve(str(root), _Slow) as (url, _, _):
        ds = StreamingDataset(url + "/ds", seq_len=SEQ, seed=3, shuffle_window=2, cache_dir=str(tmp_path / "c"))
        loader = StreamingDataLoader(ds, batch_size=B)
        it = iter(loader)
        next(it)
        order = ds.index.order(0, 0)
        first = {ds.shards[k][1].path for k in order.window_shards(0)}
        second = {ds.shards[k][1].path for k in order.window_shards(1)}
        for _ in range(3):
            next(it)
        time.sleep(0.6)  # the next window's fetch-ahead is under way by now
        loader.close()
        spans = {p.split("/ds/", 1)[1]: (a, b) for p, a, b in _Slow.spans if p.endswith(".arrow")}
        assert first <= set(spans) and second & set(spans)
        assert max(spans[p][1] for p in first) <= min(spans[p][0] for p in second & set(spans))


def test_a_shard_larger_than_the_block_size_is_one_get(kjv, tmp_path, monkeypatch):
    """A shard too small for a ranged download is not read by ranges either (its bytes could not be kept)."""
    path = kjv_lines_dataset(tmp_path / "ds", 1_500_000, "4MB")  # one shard of ~1 MB compressed
    gets = shard_gets(monkeypatch)
    with moto_s3("bench-one-get") as (endpoint, client):
        for name in os.listdir(path):
            client.upload_file(os.path.join(path, name), "bench-one-get", f"ds/{name}")
        opts = {"client_kwargs": {"endpoint_url": endpoint}, "default_block_size": 128 << 10}
        ds = StreamingDataset("s3://bench-one-get/ds", seq_len=SEQ, seed=1, cache_dir=str(tmp_path / "c"),
                              storage_options=opts)
        assert len(ds.shards) == 1 and ds.shards[0][1].bytes > 3 * (128 << 10)
        got = [b["input_ids"] for b in StreamingDataLoader(ds, batch_size=B)]
    want = [b["input_ids"] for b in StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B)]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert gets == [None]  # one whole GET, none dropped, no ranges


def test_an_object_store_manifest_is_one_get(kjv, tmp_path, monkeypatch):
    """The manifest is read in one ranged GET (no HEAD first: a round trip less before any shard); one longer
    than the first read is read whole all the same, and one past the bound is refused as before."""
    import pytest
    import s3fs

    from dataflow import FormatError
    from dataflow.formats import manifest_bounds

    path = kjv_lines_dataset(tmp_path / "ds", 300_000, "64KB")
    calls = []
    real = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *a, **kw):
        if kw.get("Key", "").endswith("index.json"):
            calls.append(method)
        return await real(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    with moto_s3("bench-manifest") as (endpoint, client):
        for name in os.listdir(path):
            client.upload_file(os.path.join(path, name), "bench-manifest", f"ds/{name}")
        opts = {"client_kwargs": {"endpoint_url": endpoint}}
        one = StreamingDataset("s3://bench-manifest/ds", seq_len=SEQ, cache_dir=str(tmp_path / "c"),
                               storage_options=opts)
        assert calls == ["get_object"]
        size = os.path.getsize(os.path.join(path, "index.json"))
        monkeypatch.setattr(manifest_bounds, "FIRST_READ_BYTES", size // 3)  # a manifest longer than the first read
        again = StreamingDataset("s3://bench-manifest/ds", seq_len=SEQ, cache_dir=str(tmp_path / "c"),
                                 storage_options=opts)
        assert [s.sha256 for _, s in again.shards] == [s.sha256 for _, s in one.shards] and len(one.shards) > 3
        monkeypatch.setenv("DATAFLOW_MANIFEST_MAX_BYTES", str(size // 2))
        with pytest.raises(FormatError, match="the most a manifest is read to"):
            StreamingDataset("s3://bench-manifest/ds", seq_len=SEQ, storage_options=opts)
        monkeypatch.setattr(manifest_bounds, "FIRST_READ_BYTES", 1 << 20)
        with pytest.raises(FormatError, match="the most a manifest is read to"):
            StreamingDataset("s3://bench-manifest/ds", seq_len=SEQ, storage_options=opts)
