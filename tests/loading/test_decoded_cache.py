"""zstd shards decoded once per machine into the shared cache and memory-mapped by every worker and rank."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta

SEQ, B = 255, 4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(path, compression: str, docs: int = 24, doc_tokens: int = 250_000, fmt: str = "arrow") -> str:
    rng = np.random.default_rng(0)
    meta = TokenizerMeta(kind="hf", name="t", vocab_size=50257, eos_id=50256)
    with ShardWriter(str(path), tokenizer_meta=meta, shard_size="1MB", compression=compression, format=fmt) as w:
        for _ in range(docs):
            w.write(rng.integers(0, 50000, size=doc_tokens).astype(np.uint16))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoded")
    out = {c: write(root / c, c) for c in ("zstd", "none")}
    out["tar.zst"] = write(root / "tar", "zstd", docs=400, doc_tokens=15_000, fmt="tar")
    return out


def batches(path, cache, workers=0, **kw):
    ds = StreamingDataset(path, seq_len=SEQ, seed=3, cache_dir=str(cache), **kw)
    loader = StreamingDataLoader(ds, batch_size=B, num_workers=workers)
    out = [b["input_ids"].clone() for b in loader]
    return out, loader


@pytest.mark.parametrize("kind,workers", [("zstd", 0), ("zstd", 2), ("tar.zst", 0), ("tar.zst", 2)])
def test_same_batches_as_decompressing_in_each_process(data, tmp_path, kind, workers):
    want, _ = batches(data[kind], tmp_path / "a", decode_once=False)
    got, loader = batches(data[kind], tmp_path / "b", workers=workers)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    n_shards = len(StreamingDataset(data[kind]).shards)
    assert loader.counts["shards_decoded"] == n_shards  # each decoded once, whatever the worker count
    assert loader.counts["decode_cpu_s"] > 0 and "decode" in loader.stage_seconds
    again, loader = batches(data[kind], tmp_path / "b", workers=workers)
    assert loader.counts["shards_decoded"] == 0 and loader.counts["decode_hits"] >= n_shards
    assert all(torch.equal(a, b) for a, b in zip(again, want))


def test_a_decode_killed_midway_leaves_nothing_trusted(data, tmp_path):
    from dataflow import FormatError

    want, _ = batches(data["zstd"], tmp_path / "ref", decode_once=False)
    cache = tmp_path / "cache"
    batches(data["zstd"], cache)
    decoded = sorted(glob.glob(str(cache / "*" / "*.decoded.arrow")))
    assert len(decoded) >= 3
    os.remove(decoded[0])  # as if the process died before the rename: only a partial file is left
    with open(decoded[0] + ".part-999999-1-1000", "wb") as f:
        f.write(b"ARROW1 half a file")
    got, _ = batches(data["zstd"], cache)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not glob.glob(decoded[0] + ".part-*") and os.path.exists(decoded[0])
    os.replace(decoded[2], decoded[1])  # another shard's copy cannot pass for this one
    with pytest.raises(FormatError, match="not of the shard the manifest names"):
        batches(data["zstd"], cache)


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


def _workers_pss(path, cache, workers, **kw) -> int:
    ds = StreamingDataset(path, seq_len=SEQ, seed=3, cache_dir=str(cache), **kw)
    loader = StreamingDataLoader(ds, batch_size=B, num_workers=workers, persistent_workers=True)
    for _ in loader:
        pass
    total = sum(_pss(p) for p in loader._pool.pids())
    loader.close()
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux smaps_rollup")
def test_workers_share_the_decoded_pages(data, tmp_path):
    """With zstd shards the workers hold about what they hold on uncompressed ones (the page cache is
    shared), not a private decompressed copy each."""
    plain = _workers_pss(data["none"], tmp_path / "c1", 4)
    decoded = _workers_pss(data["zstd"], tmp_path / "c2", 4)
    private = _workers_pss(data["zstd"], tmp_path / "c3", 4, decode_once=False)
    assert decoded <= 1.2 * plain, (decoded, plain)
    assert private > decoded  # what the shared copy saves


def test_three_processes_share_one_cache_and_decode_each_shard_once(data, tmp_path):
    cache = tmp_path / "shared"
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, sys\n"
        "from dataflow import StreamingDataset, StreamingDataLoader\n"
        "rank = int(sys.argv[1])\n"
        f"ds = StreamingDataset({data['zstd']!r}, seq_len={SEQ}, seed=3, rank=rank, world_size=3, "
        f"cache_dir={str(cache)!r})\n"
        f"loader = StreamingDataLoader(ds, batch_size={B}, num_workers=2)\n"
        "rows = [b['input_ids'][:, 0].tolist() for b in loader]\n"
        "print(json.dumps({'rows': rows, 'counts': loader.counts}))\n")
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for r in range(3)]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    n_shards = len(StreamingDataset(data["zstd"]).shards)
    assert sum(r["counts"]["shards_decoded"] for r in results) == n_shards  # once per machine
    for rank, r in enumerate(results):
        ds = StreamingDataset(data["zstd"], seq_len=SEQ, seed=3, rank=rank, world_size=3, decode_once=False)
        want = [b["input_ids"][:, 0].tolist() for b in StreamingDataLoader(ds, batch_size=B)]
        assert r["rows"] == want
