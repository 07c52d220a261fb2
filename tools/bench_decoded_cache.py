"""zstd shards with the node-wide decoded cache, against uncompressed shards and per-process decoding.

Two epochs per case over the same random tokens written twice (zstd and uncompressed Arrow), fresh
cache for each case, `StreamingDataLoader(batch_size=8, seq_len=2048)` with persistent workers. Prints,
per worker count: the loader processes' total PSS after the epochs (main + workers, from
/proc/PID/smaps_rollup), tokens/s of the first epoch (the cache is cold: shards are decoded while
read) and of the second, the decode CPU and the shards decoded (`loader.counts`); then the ratios the
issue asks for (PSS zstd / uncompressed, throughput zstd / uncompressed).

    python tools/bench_decoded_cache.py                  # 12 shards of 24 MB of tokens
    python tools/bench_decoded_cache.py --shards 4 --shard-mb 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta  # noqa: E402


def write(path: str, compression: str, shards: int, shard_mb: int) -> str:
    rng = np.random.default_rng(0)
    meta = TokenizerMeta(kind="hf", name="random", vocab_size=50257, eos_id=50256)
    doc = 1_000_000
    with ShardWriter(path, tokenizer_meta=meta, shard_size=f"{shard_mb}MB", compression=compression) as w:
        for _ in range(shards * shard_mb * (1 << 20) // (2 * doc)):
            w.write(rng.integers(0, 50000, size=doc).astype(np.uint16))
    return path


def pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


def run(path: str, workers: int, decode_once: bool, cache: str) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    ds = StreamingDataset(path, seq_len=2048, seed=0, cache_dir=cache, decode_once=decode_once)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, persistent_workers=True)
    rates = []
    for _ in range(2):
        t0, n = time.perf_counter(), 0
        for b in loader:
            n += b["input_ids"].numel()
        rates.append(n / (time.perf_counter() - t0))
    pids = [os.getpid(), *(loader._pool.pids() if loader._pool else [])]
    out = {"pss_mb": sum(pss(p) for p in pids) / 1e6, "cold": rates[0], "warm": rates[1], **loader.counts}
    loader.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=12)
    p.add_argument("--shard-mb", type=int, default=24, help="MB of tokens per shard")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="dataflow-decoded-bench-")
    try:
        data = {c: write(os.path.join(work, c), c, args.shards, args.shard_mb) for c in ("zstd", "none")}
        print(f"{args.shards} shards x {args.shard_mb} MB of tokens; one epoch per case; seq_len 2048, batch 8\n")
        print(f"{'workers':>7}  {'shards':<20} {'PSS MB':>7} {'epoch 1 tok/s':>14} {'epoch 2 tok/s':>14} "
              f"{'decode CPU s':>12} {'decoded':>8}")
        for workers in args.workers:
            rows = {}
            for name, path, once in (("uncompressed", data["none"], True), ("zstd, decoded once", data["zstd"], True),
                                     ("zstd, per process", data["zstd"], False)):
                r = rows[name] = run(path, workers, once, os.path.join(work, "cache"))
                print(f"{workers:>7}  {name:<20} {r['pss_mb']:>7.0f} {r['cold'] / 1e6:>13.1f}M {r['warm'] / 1e6:>13.1f}M "
                      f"{r['decode_cpu_s']:>12.2f} {r['shards_decoded']:>8}", flush=True)
            z, u, each = rows["zstd, decoded once"], rows["uncompressed"], rows["zstd, per process"]
            print(f"         PSS zstd / uncompressed: {z['pss_mb'] / u['pss_mb']:.2f}x (per process decoding: "
                  f"{each['pss_mb'] / u['pss_mb']:.2f}x); throughput zstd / uncompressed: epoch 1 "
                  f"{z['cold'] / u['cold']:.2f}x, epoch 2 {z['warm'] / u['warm']:.2f}x (per process decoding: "
                  f"{each['cold'] / u['cold']:.2f}x, {each['warm'] / u['warm']:.2f}x)\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
