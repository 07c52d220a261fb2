"""Streaming from object storage: dataflow against a local S3 server (moto) behind a throttling proxy of our own.

Per link condition (round trip / shared cap, `tools/bench_remote_proxy.py` on 127.0.0.1) and worker count,
each case in a fresh process with a cold cache: `StreamingDataset("s3://...", seq_len=2048, shuffle)`, batches
of 8, the first epoch. Measured:
- time to first batch, cold (from making the dataset) and after a resume at half an epoch (fresh cache);
- share of the link's token ceiling over the first epoch, start included (cap / compressed bytes per token);
- bytes fetched (the proxy's count of bytes sent down), cold and after the resume, against the dataset's bytes;
- GET requests; peak memory of the loader's process tree (RSS, polled); the cache's peak bytes on disk (polled).
The baseline is measured in the same run: a plain boto3 download of every shard, one after another, through
the same proxy (what the link gives one client), and, with `--baseline-src DIR` (a checkout of an older
dataflow, e.g. `git worktree add /tmp/old HEAD~5`), the same cases on that code; ratios are printed.

    python tools/bench_remote.py                                   # 4 shards, 32M tokens, 20ms/100MB/s and 100ms/25MB/s
    python tools/bench_remote.py --tokens 16M --conditions 100:25 --workers 0 --baseline-src /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bench"
SEQ, BATCH = 2048, 8


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_dataset(out: str, tokens: int, shards: int) -> str:
    """KJV tokenized with GPT-2 (tests/data), repeated to `tokens` tokens, in `shards` zstd Arrow shards."""
    import numpy as np
    import zstandard
    from tokenizers import Tokenizer

    sys.path.insert(0, ROOT)
    from dataflow import ShardWriter, TokenizerMeta

    data = os.path.join(ROOT, "tests", "data")
    dctx = zstandard.ZstdDecompressor()
    with open(os.path.join(data, "gpt2-tokenizer.json.zst"), "rb") as f:
        tok = Tokenizer.from_str(dctx.stream_reader(f).read().decode())
    with open(os.path.join(data, "kjv.jsonl.zst"), "rb") as f:
        lines = [json.loads(x)["text"] for x in dctx.stream_reader(f).read().splitlines() if x.strip()]
    docs = [np.array(e.ids + [50256], dtype=np.uint16) for e in tok.encode_batch(lines)]
    total = sum(len(d) for d in docs)
    meta = TokenizerMeta(kind="hf", name="gpt2", vocab_size=50257, eos_id=50256)
    size = tokens * 2 // shards
    written, copy = 0, 0
    with ShardWriter(out, tokenizer_meta=meta, shard_size=f"{size}B", compression="zstd") as w:
        while written < tokens:
            for i, d in enumerate(docs):
                w.write(d, id=f"{copy}-{i}")
            written += total
            copy += 1
    return out


class Moto:
    """moto's S3 server in a subprocess, holding the dataset at s3://bench/ds."""

    def __init__(self, dataset: str):
        self.port = _port()
        exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        import boto3

        self.client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1")
        for _ in range(600):
            try:
                self.client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                time.sleep(0.05)
        for name in os.listdir(dataset):
            self.client.upload_file(os.path.join(dataset, name), BUCKET, f"ds/{name}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Proxy:
    """`bench_remote_proxy.py` in front of moto: (round trip ms, cap MB/s)."""

    def __init__(self, upstream: int, latency_ms: float, mbps: float, folder: str):
        self.port, self.stats_path = _port(), os.path.join(folder, f"proxy-{latency_ms}-{mbps}.json")
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "bench_remote_proxy.py"),
                                      "--to", f"127.0.0.1:{upstream}", "--port", str(self.port), "--mbps", str(mbps),
                                      "--latency-ms", str(latency_ms), "--stats", self.stats_path])
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

    def stats(self) -> dict:
        time.sleep(0.5)  # its file is written every 0.2 s
        with open(self.stats_path) as f:
            return json.load(f)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def _folder_bytes(folder: str) -> int:
    total = 0
    for base, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(base, name))
            except OSError:
                pass
    return total


def child(spec: dict) -> dict:
    """One case, in this (fresh) process: cold epoch, then a resume at half an epoch on a fresh cache."""
    if spec.get("src"):
        sys.path.insert(0, spec["src"])
    else:
        sys.path.insert(0, ROOT)
    from dataflow import StreamingDataLoader, StreamingDataset

    opts = {"client_kwargs": {"endpoint_url": spec["endpoint"]}}
    peak, cache_peak = [0], [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(os.getpid()))
            for part in ("cold", "resumed"):  # two caches, one limit each
                cache_peak[0] = max(cache_peak[0], _folder_bytes(os.path.join(spec["cache"], part)))
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()

    def loader(cache: str) -> StreamingDataLoader:
        ds = StreamingDataset(f"s3://{BUCKET}/ds", seq_len=SEQ, seed=1, shuffle_window=spec["window"],
                              cache_dir=cache, cache_limit=spec["limit"], storage_options=opts)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=spec["workers"])

    t0 = time.perf_counter()
    cold = loader(os.path.join(spec["cache"], "cold"))
    opened = time.perf_counter() - t0
    it = iter(cold)
    next(it)
    first = time.perf_counter() - t0
    n = 1
    half = len(cold) // 2
    state = None
    for _ in it:
        n += 1
        if n == half:
            state = cold.state_dict()
    epoch_s = time.perf_counter() - t0
    tokens = n * BATCH * SEQ
    cold.close()
    print(json.dumps({"mark": "resume"}), flush=True)
    sys.stdin.readline()  # the parent reads the proxy's counters between the two parts
    t0 = time.perf_counter()
    resumed = loader(os.path.join(spec["cache"], "resumed"))
    resumed.load_state_dict(state)
    it = iter(resumed)
    next(it)
    first_resumed = time.perf_counter() - t0
    rest = 1 + sum(1 for _ in it)
    resumed.close()
    stop.set()
    return {"open_s": opened, "first_s": first, "epoch_s": epoch_s, "tokens": tokens, "first_resumed_s": first_resumed,
            "rest_batches": rest, "batches": n, "peak_rss": peak[0], "cache_peak": cache_peak[0]}


def run_case(spec: dict, proxy: Proxy) -> dict:
    before = proxy.stats()
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = p.stdout.readline()
    assert json.loads(line)["mark"] == "resume", line
    mid = proxy.stats()
    p.stdin.write("\n")
    p.stdin.flush()
    out = json.loads(p.stdout.read().strip().splitlines()[-1])
    p.wait()
    after = proxy.stats()
    out["fetched"] = mid["down"] - before["down"]
    out["fetched_resumed"] = after["down"] - mid["down"]
    out["gets"] = mid["requests"] - before["requests"]
    return out


def raw_download(proxy: Proxy, names: list[str]) -> float:
    """Seconds for one client to GET every shard, one after another, through the proxy."""
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{proxy.port}", region_name="us-east-1")
    t0 = time.perf_counter()
    for name in names:
        client.get_object(Bucket=BUCKET, Key=f"ds/{name}")["Body"].read()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", default="32M", help="dataset size in tokens (K/M suffix)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--conditions", default="20:100,100:25", help="round trip ms : cap MB/s, comma-separated")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--window", type=int, default=8, help="shuffle_window")
    ap.add_argument("--limit", default="none", help="cache_limit")
    ap.add_argument("--baseline-src", help="a checkout of another dataflow to measure the same cases on")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    tokens = int(float(args.tokens.rstrip("KMkm")) * {"k": 1e3, "m": 1e6}.get(args.tokens[-1].lower(), 1))
    work = tempfile.mkdtemp(prefix="bench-remote-")
    try:
        _bench(args, tokens, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args: argparse.Namespace, tokens: int, work: str) -> None:
    sys.path.insert(0, ROOT)
    from dataflow.formats.manifest import read_manifest

    ds = write_dataset(os.path.join(work, "ds"), tokens, args.shards)
    shards = read_manifest(ds).shards
    data_bytes = sum(s.bytes for s in shards)
    bpt = data_bytes / sum(s.tokens for s in shards)
    print(f"dataset: {len(shards)} shards, {sum(s.tokens for s in shards) / 1e6:.1f}M tokens, {data_bytes / 1e6:.1f} MB "
          f"zstd ({bpt:.3f} bytes/token), shuffle_window={args.window}, cache_limit={args.limit}")
    moto = Moto(ds)
    codes = [("dataflow", None)] + ([("baseline", args.baseline_src)] if args.baseline_src else [])
    try:
        for cond in args.conditions.split(","):
            latency, mbps = (float(x) for x in cond.split(":"))
            proxy = Proxy(moto.port, latency, mbps, work)
            try:
                raw = raw_download(proxy, [s.path for s in shards])
                print(f"\n{latency:.0f} ms / {mbps:.0f} MB/s: ceiling {mbps * 1e6 / bpt / 1e6:.1f}M tokens/s; one "
                      f"client's GETs of every shard {raw:.2f} s ({data_bytes / raw / 1e6:.1f} MB/s)")
                print(f"{'code':9} {'workers':>7} {'open s':>7} {'first s':>8} {'resumed s':>9} {'ceiling':>8} {'fetched':>8} "
                      f"{'after resume':>12} {'GETs':>5} {'peak MB':>8} {'cache MB':>8}")
                results = {}
                for workers in (int(w) for w in args.workers.split(",")):
                    for code, src in codes:
                        spec = {"endpoint": f"http://127.0.0.1:{proxy.port}", "workers": workers, "src": src,
                                "window": args.window, "limit": args.limit,
                                "cache": os.path.join(work, f"cache-{code}-{workers}-{latency}")}
                        r = run_case(spec, proxy)
                        results[(code, workers)] = r
                        share = r["tokens"] / r["epoch_s"] / (mbps * 1e6 / bpt)
                        print(f"{code:9} {workers:>7} {r['open_s']:>7.2f} {r['first_s']:>8.2f} {r['first_resumed_s']:>9.2f} {share:>8.2f} "
                              f"{r['fetched'] / data_bytes:>7.2f}x {r['fetched_resumed'] / data_bytes:>11.2f}x "
                              f"{r['gets']:>5} {r['peak_rss'] / 1e6:>8.0f} {r['cache_peak'] / 1e6:>8.0f}")
                        shutil.rmtree(spec["cache"], ignore_errors=True)
                    if ("baseline", workers) in results:
                        a, b = results[("dataflow", workers)], results[("baseline", workers)]
                        print(f"  ratios dataflow/baseline, {workers} workers: first batch {a['first_s'] / b['first_s']:.2f}, "
                              f"after resume {a['first_resumed_s'] / b['first_resumed_s']:.2f}, epoch time "
                              f"{a['epoch_s'] / b['epoch_s']:.2f}, fetched after resume "
                              f"{a['fetched_resumed'] / max(b['fetched_resumed'], 1):.2f}, peak memory "
                              f"{a['peak_rss'] / b['peak_rss']:.2f}")
            finally:
                proxy.close()
    finally:
        moto.close()


if __name__ == "__main__":
    main()
