"""A remote zstd dataset through a size-limited cache: one copy of each shard, a limit that holds within one
shard per reader, the exact batches (and an exact resume) whatever the limit, a limit below one shuffle window
refused in one line, and a resume that fetches only the shuffle windows left.

Real text (KJV, byte tokens) in small zstd Arrow shards, served over HTTP from 127.0.0.1 (`http_files`)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from dataflow import ConfigError, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats.manifest import read_manifest
from dataflow.loading.decoded import size_estimate
from support.http_files import serve

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
SEQ, B, WINDOW = 127, 8, 2


@pytest.fixture(scope="module")
def kjv_shards(kjv, tmp_path_factory):
    """The first 1.2 MB of KJV as byte tokens, a chapter a document, in ~96 KB zstd shards (a dozen or so)."""
    import zstandard

    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read(1_200_000).splitlines()[:-1]
    root = tmp_path_factory.mktemp("srv")
    with ShardWriter(str(root / "ds"), tokenizer_meta=BYTES, shard_size="96KB", compression="zstd") as w:
        for i, line in enumerate(lines):
            w.write(np.frombuffer(line, np.uint8).astype(np.uint16), id=f"kjv{i}")
    return root


@pytest.fixture(scope="module")
def server(kjv_shards):
    with serve(str(kjv_shards)) as (url, asked, _):
        yield url + "/ds", asked


@pytest.fixture(scope="module")
def want(kjv_shards):
    """Every batch of the epoch, read from the local folder and decompressed in the process."""
    ds = StreamingDataset(str(kjv_shards / "ds"), seq_len=SEQ, seed=5, shuffle_window=WINDOW, decode_once=False)
    return [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=B)]


def _shards(kjv_shards):
    return read_manifest(str(kjv_shards / "ds")).shards


def _decoded_sizes(kjv_shards):
    return [size_estimate(s, "arrow", 2) for s in _shards(kjv_shards)]


def cache_bytes(cache_dir) -> int:
    """Bytes of shard data on disk in the cache (entries, decoded copies, part files; not the lock files)."""
    total = 0
    for folder, _, names in os.walk(cache_dir):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except FileNotFoundError:
                pass
    return total


class Peak:
    """Polls the cache's bytes on disk every millisecond while the block runs: the most it held."""

    def __init__(self, cache_dir):
        self.cache_dir, self.most, self._stop = cache_dir, 0, threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.most = max(self.most, cache_bytes(self.cache_dir))
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, cache_bytes(self.cache_dir))


def _loader(url, cache, limit, workers=0):
    ds = StreamingDataset(url, seq_len=SEQ, seed=5, shuffle_window=WINDOW, cache_dir=str(cache), cache_limit=limit)
    return StreamingDataLoader(ds, batch_size=B, num_workers=workers)


def _state_at(loader, batches: int) -> dict:
    """The loader's state after `batches` batches of its epoch; the loader is closed."""
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    loader.close()
    return state


@pytest.mark.parametrize("workers", [0, 2])
def test_the_limit_holds_within_one_shard_per_reader_and_the_batches_are_exact(server, kjv_shards, want, tmp_path,
                                                                               workers):
    url, _ = server
    sizes = sorted(_decoded_sizes(kjv_shards))
    limit = int(1.5 * sum(sizes[-WINDOW:]))  # one window and half of the next
    with Peak(tmp_path / "c") as peak:
        got = [b["input_ids"].clone() for b in _loader(url, tmp_path / "c", limit, workers)]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    largest = max(s.bytes + d for s, d in zip(_shards(kjv_shards), _decoded_sizes(kjv_shards)))
    readers = max(workers, 1)
    assert peak.most <= limit + readers * largest, (peak.most, limit, largest)


def test_a_decoded_shard_replaces_its_compressed_copy(server, kjv_shards, want, tmp_path):
    url, _ = server
    got = [b["input_ids"].clone() for b in _loader(url, tmp_path / "c", "none")]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    names = [n for _, _, ns in os.walk(tmp_path / "c") for n in ns if not n.endswith((".inuse", ".dl", ".ok"))]
    decoded = [n for n in names if n.endswith(".decoded.arrow")]
    assert len(decoded) == len(_shards(kjv_shards))
    assert sorted(names) == sorted(decoded)  # no compressed copy beside a decoded one, no part file left
    total = sum(s.bytes for s in _shards(kjv_shards)) + sum(_decoded_sizes(kjv_shards))
    assert cache_bytes(tmp_path / "c") < 0.8 * total


def test_a_resume_under_a_tight_limit_is_exact(server, kjv_shards, want, tmp_path):
    url, _ = server
    limit = int(1.2 * sum(sorted(_decoded_sizes(kjv_shards))[-WINDOW:]))
    half = len(want) // 2
    state = _state_at(_loader(url, tmp_path / "c", limit), half)
    resumed = _loader(url, tmp_path / "c2", limit)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].clone() for b in resumed]
    assert len(rest) == len(want) - half and all(torch.equal(a, b) for a, b in zip(rest, want[half:]))


def test_a_limit_below_one_shuffle_window_is_refused_naming_its_size(server, kjv_shards, tmp_path):
    url, _ = server
    need = sum(sorted(_decoded_sizes(kjv_shards))[-WINDOW:])
    with pytest.raises(ConfigError) as err:
        _loader(url, tmp_path / "c", need - 1)
    msg = str(err.value)
    assert "\n" not in msg and "shuffle window needs" in msg and f"{need / 1e6:.1f} MB" in msg
    assert "cache_limit" in msg and "shuffle_window" in msg
    _loader(url, tmp_path / "c", need)  # one window exactly is enough


def test_a_resume_fetches_only_the_windows_left(server, kjv_shards, want, tmp_path):
    """Half way through an epoch of many shuffle windows, a fresh cache: the resumed run downloads the shards
    of the windows left (the current one whole: its samples are shuffled over all of its shards), no other."""
    url, asked = server
    half = len(want) // 2
    state = _state_at(_loader(url, tmp_path / "c", "none"), half)
    ds = StreamingDataset(url, seq_len=SEQ, seed=5, shuffle_window=WINDOW, cache_dir=str(tmp_path / "c2"))
    order = ds.index.order(0, 0)
    consumed = state["consumed"] if "consumed" in state else half * B
    first_window = int(order.window_of(consumed))
    left = {ds.shards[k][1].path for w in range(first_window, order.num_windows) for k in order.window_shards(w)}
    resumed = StreamingDataLoader(ds, batch_size=B)
    resumed.load_state_dict(state)
    del asked[:]
    rest = [b["input_ids"].clone() for b in resumed]
    assert all(torch.equal(a, b) for a, b in zip(rest, want[half:]))
    fetched = [p.split("/ds/", 1)[1] for p in asked if "/ds/" in p and p.endswith(".arrow")]
    assert sorted(fetched) == sorted(left)  # each once, and only those
    sizes = {s.path: s.bytes for s in _shards(kjv_shards)}
    assert sum(sizes[p] for p in fetched) < 0.75 * sum(sizes.values())


def test_a_download_put_in_place_while_the_cache_is_counted_is_counted(tmp_path, monkeypatch):
    """The count behind every claim lists a folder, then sizes each file: a download renamed into place in
    between (its part file gone, its entry not listed) was counted nowhere, so a claim took its room and the
    cache passed its limit (seen as a fourth shard fetched into room for three). Now the folder is listed again."""
    from dataflow.loading import cache

    folder = tmp_path / "0123456789abcdef"
    folder.mkdir()
    (folder / "fedcba9876543210-shard-00000.arrow").write_bytes(b"x" * 1000)
    entry = folder / "aaaaaaaaaaaaaaaa-shard-00001.arrow"
    part = cache.part_path(str(entry), 3000)
    with open(part, "wb") as f:
        f.write(b"y" * 3000)
    real_stat, renamed = os.stat, []

    def stat_after_the_rename(path, *args, **kwargs):
        if str(path) == part and not renamed:
            os.replace(part, entry)  # the download finishes just between the listing and this stat
            renamed.append(part)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_after_the_rename)
    assert cache.usage(str(tmp_path)) == 4000 and renamed  # the count every claim and eviction starts from
