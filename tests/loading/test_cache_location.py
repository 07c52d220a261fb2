"""Where the remote-shard cache lives by default, how much it may hold, and a full disk as a clear error."""

import errno
import os
import shutil
from collections import namedtuple

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from dataflow import ShardWriter, TokenizerMeta
from dataflow.errors import CacheFullError, StorageError
from dataflow.formats.manifest import read_manifest
from dataflow.loading import cache
from dataflow.loading.storage import DEFAULT_SHARE, Storage, default_cache_dir

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def remote(tmp_path):
    """A small dataset in fsspec's in-memory filesystem, at memory://cache-test/ds."""
    local = tmp_path / "local"
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    with ShardWriter(str(local), tokenizer_meta=meta, shard_size="4KB") as w:
        for i in range(20):
            w.write(np.arange(i, i + 900, dtype=np.uint16) % 256, id=f"d{i}")
    fs = fsspec.filesystem("memory")
    for name in os.listdir(local):
        fs.pipe(f"/cache-test/ds/{name}", (local / name).read_bytes())
    yield "memory://cache-test/ds", read_manifest(str(local)).shards
    fs.rm("/cache-test", recursive=True)


def test_default_cache_dir_follows_dataflow_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("DATAFLOW_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "dataflow")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "dataflow")
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == str(tmp_path / "mine")
    assert Storage("memory://x/ds").cache_dir == str(tmp_path / "mine")


def test_default_limit_is_a_share_of_free_space_plus_what_the_cache_holds(monkeypatch, tmp_path):
    monkeypatch.delenv("DATAFLOW_CACHE_LIMIT", raising=False)
    held = tmp_path / "c" / ("a" * 16) / ("0" * 16 + "-shard-00000.arrow")
    held.parent.mkdir(parents=True)
    held.write_bytes(b"x" * 1000)
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda p: Usage(10**12, 0, 10_000))
    st = Storage("memory://x/ds", str(tmp_path / "c"))
    assert st.cache_limit == int(DEFAULT_SHARE * (10_000 + 1000))
    fresh = Storage("memory://x/ds", str(tmp_path / "not" / "made" / "yet"))  # its disk, before it exists
    assert fresh.cache_limit == int(DEFAULT_SHARE * 10_000)
    assert Storage("memory://x/ds", str(tmp_path / "c"), cache_limit="none").cache_limit is None
    monkeypatch.setenv("DATAFLOW_CACHE_LIMIT", "2GB")
    assert Storage("memory://x/ds", str(tmp_path / "c")).cache_limit == 2 << 30  # binary units (parse_size)
    assert Storage(str(tmp_path), str(tmp_path / "c"), cache_limit=None).cache_limit is not None  # env applies
    monkeypatch.delenv("DATAFLOW_CACHE_LIMIT")
    assert Storage(str(tmp_path), str(tmp_path / "c")).cache_limit is None  # local data is never cached


def test_disk_full_while_downloading_is_one_clear_error_and_leaves_no_partial(remote, tmp_path, monkeypatch):
    url, shards = remote
    calls = []

    def get_file(self, rpath, lpath, **kw):
        calls.append(rpath)
        with open(lpath, "wb") as f:
            f.write(b"half a shard")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), lpath)

    monkeypatch.setattr(MemoryFileSystem, "get_file", get_file)
    with Storage(url, str(tmp_path / "cache"), cache_limit="1GB") as st:
        with pytest.raises(CacheFullError) as e:
            st.local_path(shards[0])
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "cache") in msg and "disk full" in msg
    assert "No space left on device" in msg and "DATAFLOW_CACHE" in msg and "cache_limit" in msg
    assert isinstance(e.value, StorageError) and len(calls) == 1  # not retried: waiting frees no space
    left = [f for _, _, files in os.walk(tmp_path / "cache") for f in files if ".part-" in f]
    assert left == []


def test_a_shard_larger_than_the_free_space_is_refused_before_downloading(remote, tmp_path, monkeypatch):
    url, shards = remote
    calls = []
    real_get = MemoryFileSystem.get_file
    monkeypatch.setattr(MemoryFileSystem, "get_file", lambda self, *a, **k: calls.append(a) or real_get(self, *a, **k))
    real = shutil.disk_usage
    with Storage(url, str(tmp_path / "cache"), cache_limit="1GB") as st:
        assert os.path.exists(st.local_path(shards[0]))  # room: downloaded
        st.release(shards[0])
        monkeypatch.setattr("dataflow.loading.storage.shutil.disk_usage", lambda p: Usage(*real(p)[:2], 10))
        with pytest.raises(CacheFullError, match="0.0 MB free"):
            st.local_path(shards[1])
    assert len(calls) == 1


def test_engine_proofs_live_in_the_same_cache_folder(monkeypatch, tmp_path):
    """DATAFLOW_CACHE moves every cache of the machine, the engine proofs too (they went to ~/.cache whatever it
    said, and an empty XDG_CACHE_HOME made them a folder relative to wherever a command ran)."""
    from dataflow.tokenizers.bpe_convert import proof_cache_dir

    monkeypatch.delenv("DATAFLOW_PROOF_CACHE", raising=False)
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "mine"))
    assert proof_cache_dir() == str(tmp_path / "mine" / "engine-proofs")
    monkeypatch.delenv("DATAFLOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert proof_cache_dir() == str(tmp_path / "home" / ".cache" / "dataflow" / "engine-proofs")
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path / "proofs"))
    assert proof_cache_dir() == str(tmp_path / "proofs")
