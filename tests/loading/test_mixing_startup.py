"""Dataset mixing, start-up cost with huge manifests, and resume that never re-reads finished shards."""

import json
import os
import time

import numpy as np
import pytest

import dataflow.loading.dataset as dataset_module
import dataflow.loading.reader as reader_module
from dataflow import ConfigError, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta

META = TokenizerMeta(kind="hf", name="counting", vocab_size=65536, eos_id=65535)
SEQ = 16


def make(path, start, n, shard_size="8KB"):
    with ShardWriter(str(path), tokenizer_meta=META, shard_size=shard_size) as w:
        for doc in np.array_split(np.arange(start, start + n), max(1, n // 500)):
            w.write(doc)
    return str(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return make(root / "a", 0, 30_000), make(root / "b", 30_000, 8_000), make(root / "c", 40_000, 2_000)


def source_of(window):
    return 0 if window[0] < 30_000 else 1 if window[0] < 40_000 else 2


def test_mixing_proportions_within_one_sample_over_any_prefix(sources):
    weights = {sources[0]: 0.5, sources[1]: 0.3, sources[2]: 0.2}
    ds = StreamingDataset(weights, seq_len=SEQ, seed=1)
    got = [source_of(row.tolist()) for b in StreamingDataLoader(ds, batch_size=10) for row in b["input_ids"]]
    n = np.arange(1, len(got) + 1)
    for s, w in enumerate([0.5, 0.3, 0.2]):
        assert np.abs(np.cumsum(np.array(got) == s) - n * w).max() <= 1.0
    # the small source (c: 124 windows) went through several of its own epochs, each complete
    c_windows = [tuple(row.tolist()) for b in StreamingDataLoader(StreamingDataset(weights, seq_len=SEQ, seed=1),
                                                                   batch_size=10)
                 for row in b["input_ids"] if row[0] >= 40_000]
    per_epoch = StreamingDataset(sources[2], seq_len=SEQ).num_samples
    assert len(c_windows) > 2 * per_epoch
    assert len(set(c_windows[:per_epoch])) == per_epoch and set(c_windows[:per_epoch]) == set(
        c_windows[per_epoch:2 * per_epoch])


def test_mixing_is_deterministic_and_resumes_exactly(sources):
    weights = {sources[0]: 2, sources[1]: 1}
    full = [b["input_ids"].clone() for b in StreamingDataLoader(StreamingDataset(weights, seq_len=SEQ), batch_size=4)]
    loader = StreamingDataLoader(StreamingDataset(weights, seq_len=SEQ), batch_size=4)
    it = iter(loader)
    for _ in range(50):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = StreamingDataLoader(StreamingDataset(weights, seq_len=SEQ), batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(full) - 50 and all((a == b).all() for a, b in zip(rest, full[50:]))


def test_a_small_weight_is_served_not_rounded_away(sources):
    # weights were rounded to multiples of 1/10,000: a source at 4e-5 of the mix got no sample at all
    weights = {sources[0]: 1.0, sources[2]: 4e-5}
    ds = StreamingDataset(weights, seq_len=SEQ, seed=1)
    source, _ = ds.index.blend.locate(np.arange(200_000))
    assert (source == 1).sum() == 8  # 4e-5 of 200,000 samples
    with pytest.raises(ConfigError, match=r"mixing weight 1e-07 \(source 1\) is below 1/2,000,000 .* leave the "
                                          r"source out"):
        StreamingDataset({sources[0]: 1.0, sources[2]: 1e-7}, seq_len=SEQ)


@pytest.mark.timing  # also compares the first batch's wall time with the manifest read's
def test_startup_reads_only_the_manifest_with_100k_shards(tmp_path, monkeypatch):
    make(tmp_path / "one", 0, 4_000, shard_size="1MB")
    index = json.loads((tmp_path / "one" / "index.json").read_text())
    shard = index["shards"][0]
    big = tmp_path / "big"
    big.mkdir()
    (big / "shard-00000.arrow").write_bytes((tmp_path / "one" / shard["path"]).read_bytes())
    index["shards"] = [dict(shard, path=f"shard-{i:06d}.arrow") for i in range(100_000)]  # 100,000 entries ...
    for entry in index["shards"]:
        os.symlink("shard-00000.arrow", big / entry["path"])  # ... each its own name for one real file
    (big / "index.json").write_text(json.dumps(index))
    opened = []
    real = reader_module.OpenShard

    def counting(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reader_module, "OpenShard", counting)
    t0 = time.perf_counter()
    dataset_module.read_manifest(str(big))
    manifest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = next(iter(StreamingDataLoader(StreamingDataset(str(big), seq_len=SEQ, shuffle_window=8), batch_size=8)))
    first_batch_s = time.perf_counter() - t0
    assert batch["input_ids"].shape == (8, SEQ)
    assert len(opened) <= 8  # only shards the first batch needs, never a scan of all 100,000
    assert first_batch_s < 4 * manifest_s + 0.5  # dominated by reading the manifest once


def test_resume_never_refetches_finished_shards(sources, monkeypatch):
    ds = StreamingDataset(sources[0], seq_len=SEQ, shuffle_window=2, seed=4)
    loader = StreamingDataLoader(ds, batch_size=8)
    order = ds.order()
    it = iter(loader)
    for _ in range(len(loader) * 2 // 3):
        next(it)
    state = loader.state_dict()
    current_window = int(order.window_of(state["consumed"]))
    finished = set(ds.streams[0][order.order[:current_window * 2]].tolist())
    opened = []
    real = reader_module.ShardReader.shard

    def counting(self, k, times=None):
        if k not in self._open:
            opened.append(k)
        return real(self, k, times)

    monkeypatch.setattr(reader_module.ShardReader, "shard", counting)
    resumed = StreamingDataLoader(StreamingDataset(sources[0], seq_len=SEQ, shuffle_window=2, seed=4), batch_size=8)
    resumed.load_state_dict(state)
    remaining = resumed.dataset.plan(batch_size=8).num_batches  # the rest of the epoch
    assert remaining > 0 and len(list(resumed)) == remaining
    assert opened and not (set(opened) & finished)
