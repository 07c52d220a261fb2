"""What a server answered is quoted by its first line, at most a few hundred characters, wherever a failed
request is described (`remote.describe`: the loader's download errors and retry warnings, uploads, merge): a
server that answers protocol garbage made a 144 KB "one line" of escaped bytes."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dataflow import ShardWriter, StorageError, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats import remote
from support.http_files import _Files, serve

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
GARBAGE = b"\x00\x01garbage from the server\n" * 4000


class Garbage(_Files):
    """Serves the manifest; every shard request is answered with bytes that are not HTTP."""

    def _file(self):
        if self.path.endswith(".arrow"):
            self.close_connection = True
            self.wfile.write(GARBAGE)
            return None
        return super()._file()


def test_a_shard_download_answered_with_garbage_is_one_short_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    with ShardWriter(str(tmp_path / "www" / "ds"), tokenizer_meta=BYTES, shard_size="4KB") as w:
        for i in range(10):
            w.write((np.arange(i, i + 500) % 256).astype(np.uint16), id=f"d{i}")
    caplog.set_level(logging.INFO)
    with serve(tmp_path / "www", handler=Garbage) as (url, _, _):
        ds = StreamingDataset(f"{url}/ds", seq_len=16, shuffle=False, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(StorageError) as raised:
            for _ in StreamingDataLoader(ds, batch_size=2):
                pass
        ds.close()
    message = str(raised.value)
    assert message.startswith(f"{url}/ds/shard-") and "\n" not in message
    assert len(message) < 2000 and message.count("garbage") <= 10, f"{len(message)} characters"
    logged = [r.getMessage() for r in caplog.records]
    assert logged and all(len(m) < 2000 for m in logged), max(map(len, logged))


def test_describe_quotes_the_status_and_the_first_line():
    class Answer(Exception):
        status = 503

    e = Answer("Service Unavailable\n" + "<html>" + "x" * 10_000)
    assert remote.describe(e) == "HTTP 503: Service Unavailable"
    assert len(remote.describe(OSError("y" * 50_000))) <= 200
