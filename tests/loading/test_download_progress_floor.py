"""A shard download has a progress floor: a transfer whose bytes keep coming, but slower than
DATAFLOW_MIN_TRANSFER_BPS over the last DATAFLOW_SLOW_TRANSFER_S seconds, fails in one line naming the shard
and the rate, after one warning; it is retried on a fresh connection, within the download's attempts. The
floor is measured over that sliding span, never per read: a short pause inside a healthy transfer is fine.

A real HTTP server on 127.0.0.1 serves the shards at a set pace; the floor is 1 KB/s over 1 s here, so each
slow attempt ends in about a second while the shard would take minutes at the served rate.
"""

import hashlib
import logging
import re
import time

import numpy as np
import pytest

from dataflow import ShardWriter, StorageError, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.cli import main
from dataflow.formats import remote
from dataflow.formats.manifest import read_manifest
from dataflow.loading.storage import Storage
from support.http_files import _Files, serve

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


class _Paced(_Files):
    """Serves index.json at once and each shard by `pace(body)`: a list of (bytes, then seconds of sleep);
    records each shard request's client port in `ports` (a new port is a new connection). Both are set on a
    subclass made per test."""

    pace = None
    ports: list = []

    def do_GET(self):  # noqa: N802
        body = self._file()
        if body is None:
            return
        if not self.path.endswith(".arrow"):
            self.wfile.write(body)
            return
        self.ports.append(self.client_address[1])
        try:
            for piece, pause in type(self).pace(body):
                self.wfile.write(piece)
                self.wfile.flush()
                time.sleep(pause)
        except OSError:  # the client gave up on this transfer
            self.close_connection = True


def _trickle(rate, piece=20):
    """The whole body at `rate` bytes/s, in pieces of `piece` bytes."""
    return lambda body: [(body[i:i + piece], piece / rate) for i in range(0, len(body), piece)]


@pytest.fixture
def www(tmp_path, monkeypatch):
    """(the server, its URL, the dataset's shards): one uncompressed shard of about 32 KB."""
    with ShardWriter(str(tmp_path / "www" / "ds"), tokenizer_meta=BYTES, shard_size="64KB",
                     compression="none") as w:
        for i in range(30):
            w.write((np.arange(i, i + 500) % 256).astype(np.uint16), id=f"d{i}")
    shards = read_manifest(str(tmp_path / "www" / "ds")).shards
    assert len(shards) == 1 and shards[0].bytes > 16_000
    monkeypatch.setenv("DATAFLOW_MIN_TRANSFER_BPS", "1024")
    monkeypatch.setenv("DATAFLOW_SLOW_TRANSFER_S", "1")
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    handler = type("Paced", (_Paced,), {"ports": []})
    with serve(tmp_path / "www", handler) as (url, _, _):
        yield handler, f"{url}/ds", shards


def _slow_error(caplog, st, shard):
    with caplog.at_level(logging.WARNING, logger="dataflow"), pytest.raises(StorageError) as e:
        st.local_path(shard)
    return str(e.value)


def test_a_trickling_shard_fails_naming_the_shard_and_rate_after_one_warning(www, tmp_path, caplog):
    srv, url, shards = www
    srv.pace = _trickle(200)  # 32 KB at 200 B/s: nearly three minutes
    start = time.monotonic()
    with Storage(url, str(tmp_path / "cache"), retries=2) as st:
        message = _slow_error(caplog, st, shards[0])
    assert time.monotonic() - start < 30  # each attempt ends at the floor, not with the shard
    assert f"{url}/{shards[0].path}" in message and "\n" not in message
    rate = float(re.search(r"\((\d+) B/s over the last 1 s", message).group(1))
    assert 50 <= rate <= 400, message  # the rate it measured: about the 200 B/s served
    assert "1024 B/s" in message and "DATAFLOW_MIN_TRANSFER_BPS" in message and "2 attempts" in message
    warnings = [r.getMessage() for r in caplog.records if ": receiving " in r.getMessage()]
    assert len(warnings) == 1 and shards[0].path in warnings[0]  # once, not once per attempt
    assert len(srv.ports) == 2 and len(set(srv.ports)) == 2  # retried once, on a fresh connection


def test_a_transfer_that_slows_down_midway_is_caught_by_the_sliding_span(www, tmp_path, caplog):
    """8 KB at once, then 100 B/s: the average since the start stays above the floor for a minute; the
    bytes of the last second do not."""
    srv, url, shards = www
    srv.pace = lambda body: [(body[:8192], 0.0)] + _trickle(100, piece=10)(body[8192:])
    start = time.monotonic()
    with Storage(url, str(tmp_path / "cache"), retries=1) as st:
        message = _slow_error(caplog, st, shards[0])
    assert time.monotonic() - start < 20
    assert f"{url}/{shards[0].path}" in message and "B/s" in message and "1 attempt" in message


def test_a_healthy_transfer_with_a_pause_inside_succeeds_without_warning(www, tmp_path, caplog):
    """16 KB/s with one 0.3 s stall halfway: about 2.3 s in all, longer than the 1 s span; a check per read
    would fail it during the stall."""
    srv, url, shards = www

    def bursty(body):
        pieces = _trickle(16384, piece=1024)(body)
        half = len(pieces) // 2
        pieces[half] = (pieces[half][0], 0.3)
        return pieces

    srv.pace = bursty
    with caplog.at_level(logging.WARNING, logger="dataflow"), Storage(url, str(tmp_path / "cache")) as st:
        path = st.local_path(shards[0])
        with open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == shards[0].sha256
        st.release(shards[0])
    assert not [r for r in caplog.records if "floor" in r.getMessage() or "attempt" in r.getMessage()]
    assert len(srv.ports) == 1


def test_the_loader_reports_a_trickling_shard_in_one_line(www, tmp_path):
    srv, url, shards = www
    srv.pace = _trickle(200)
    ds = StreamingDataset(url, seq_len=16, shuffle=False, cache_dir=str(tmp_path / "cache"))
    try:
        with pytest.raises(StorageError, match=r"B/s.*below the floor") as e:
            next(iter(StreamingDataLoader(ds, batch_size=2)))
    finally:
        ds.close()
    assert shards[0].path in str(e.value)


@pytest.mark.parametrize("name,value", [("DATAFLOW_MIN_TRANSFER_BPS", "fast"), ("DATAFLOW_SLOW_TRANSFER_S", "0")])
def test_a_bad_floor_setting_is_one_line_before_any_work(www, capsys, monkeypatch, name, value):
    _, url, _ = www
    monkeypatch.setenv(name, value)
    assert main(["inspect", url]) == 2
    err = capsys.readouterr().err.strip()
    assert name in err and "\n" not in err
