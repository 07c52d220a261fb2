"""Lock files (`<entry>.inuse`, `<entry>.dl`) go once nothing uses them, and deleting them stays safe:
a lock taken on a lock file that was deleted meanwhile is never trusted, an entry in use is never evicted.
"""

import fcntl
import os
import subprocess
import sys
import textwrap

import fsspec
import numpy as np
import pytest

from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats.manifest import read_manifest
from dataflow.loading import cache
from dataflow.loading.storage import Storage

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def zstd_ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("zstd")
    with ShardWriter(str(out), tokenizer_meta=BYTES, shard_size="8KB", compression="zstd") as w:
        for i in range(40):
            w.write((np.arange(i, i + 700) % 256).astype(np.uint16), id=f"d{i}")
    return str(out)


def _lock_files(folder):
    return sorted(str(p) for p in folder.rglob("*") if p.name.endswith((".inuse", ".dl")))


@pytest.mark.parametrize("workers", [0, 2])
def test_no_lock_file_is_left_once_the_processes_are_gone(zstd_ds, tmp_path, workers):
    """A training script reads a zstd dataset (decoded once into the cache) and exits normally."""
    script = textwrap.dedent(f"""
        from dataflow import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset({zstd_ds!r}, seq_len=32, cache_dir={str(tmp_path / "c")!r})
        loader = StreamingDataLoader(ds, batch_size=2, num_workers={workers}, persistent_workers=True)
        n = sum(1 for _ in loader) + sum(1 for _ in loader)
        assert n > 10, n
    """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300)
    decoded = [p for p in (tmp_path / "c").rglob("*.decoded.arrow")]
    assert len(decoded) == len(read_manifest(zstd_ds).shards)  # the cache itself stays
    assert _lock_files(tmp_path / "c") == []


def test_closing_a_dataset_lets_go_of_its_lock_files_and_it_reads_again(zstd_ds, tmp_path):
    ds = StreamingDataset(zstd_ds, seq_len=32, cache_dir=str(tmp_path / "c"))
    first = [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=2)]
    assert _lock_files(tmp_path / "c")  # the last shuffle window is still open
    ds.close()
    assert _lock_files(tmp_path / "c") == []
    ds.set_epoch(0)
    again = [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=2)]
    assert all((a == b).all() for a, b in zip(first, again)) and len(first) == len(again)


@pytest.fixture
def remote_ds(zstd_ds):
    fs = fsspec.filesystem("memory")
    for name in os.listdir(zstd_ds):
        fs.pipe(f"/lockfiles/ds/{name}", open(os.path.join(zstd_ds, name), "rb").read())
    yield "memory://lockfiles/ds", read_manifest(zstd_ds).shards
    fs.rm("/lockfiles", recursive=True)


def test_a_lock_file_stays_while_anyone_holds_it_and_goes_with_the_last(remote_ds, tmp_path):
    url, shards = remote_ds
    a, b = Storage(url, str(tmp_path / "c")), Storage(url, str(tmp_path / "c"))
    path = a.local_path(shards[0])
    for _ in range(3):  # b takes and lets go: a still holds it, so its lock file stays
        assert b.local_path(shards[0]) == path
        b.release(shards[0])
        assert os.path.exists(path + ".inuse")
    assert not os.path.exists(path + ".dl")  # the download is over: its lock went with it
    cache.evict(str(tmp_path / "c"), 0, 0)  # evict everything that is not in use
    assert os.path.exists(path)  # a's lock still protects it
    a.release(shards[0])
    assert not os.path.exists(path + ".inuse")
    cache.evict(str(tmp_path / "c"), 0, 0)
    assert not os.path.exists(path) and _lock_files(tmp_path / "c") == []


def test_a_lock_on_a_file_deleted_meanwhile_is_taken_again_on_the_new_one(tmp_path, monkeypatch):
    """Another process deletes the lock file between our open and our flock (what `release` may do):
    `lock` must end up holding the file that the path names, never the deleted one."""
    path = str(tmp_path / "x.inuse")
    real = fcntl.flock
    deleted = []

    def flock_after_a_delete(fd, op):
        if not deleted:
            deleted.append(os.fstat(fd).st_ino)
            os.remove(path)  # the other process's tidy-up
            other = cache.lock(path, fcntl.LOCK_EX)  # and a third one takes the new file meanwhile
            cache.unlock(other)
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_delete)
    fd = cache.lock(path, fcntl.LOCK_SH)
    assert deleted and os.fstat(fd).st_ino == os.stat(path).st_ino != deleted[0]
    cache.release(fd, path)
    assert not os.path.exists(path)
