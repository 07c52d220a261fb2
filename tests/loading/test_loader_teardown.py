"""Dropping a dataset never waits on threads: its `Storage.__del__` may run anywhere the cyclic GC runs,
including inside a thread's start-up while it holds threading's own locks, where a join deadlocks
(seen as a 300 s hang in a suite run: GC in `_maintain_shutdown_locks` -> `Storage.close()` -> join)."""

import threading

from dataflow import StreamingDataLoader, StreamingDataset
from support.data import write_counting_dataset


def test_a_dropped_storage_joins_no_thread(tmp_path, monkeypatch):
    path = write_counting_dataset(tmp_path / "d", 40_000, 20, "8KB")  # zstd: decoded ahead by a thread pool
    ds = StreamingDataset(path, seq_len=16, cache_dir=str(tmp_path / "cache"))
    for _ in StreamingDataLoader(ds, batch_size=8):
        pass
    storage = ds.storages[0]
    assert storage._pool is not None  # the fetch-ahead threads exist
    joined = []
    real_join = threading.Thread.join

    def recording_join(self, timeout=None):
        joined.append(self.name)
        return real_join(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", recording_join)
    storage.__del__()  # what the garbage collector calls
    monkeypatch.undo()
    assert joined == []
    assert storage._pool is None and storage._held == {}  # and it let go all the same
