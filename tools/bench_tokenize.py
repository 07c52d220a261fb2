"""Tokenize throughput and memory: our pipeline against the raw engine it runs, on the same cores.

The corpus is the KJV replicated to --mb megabytes of plain JSONL, tokenized with the GPT-2
`tokenizer.json`. Figures are MB of text per second, printed as ratios against the raw engines
measured in the same run (tiktoken's `encode_ordinary_batch`, tokenizers' `encode_batch`, one
thread per process, as many processes as workers). Peak RSS is measured for 10x more documents to
show that memory does not grow with the input.

    python tools/bench_tokenize.py --mb 100          # full
    python tools/bench_tokenize.py --mb 20 --quick   # a few minutes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import time

import zstandard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
GPT2 = os.path.join(SHARED, "tokenizers", "gpt2", "tokenizer.json")


def kjv_lines() -> list[bytes]:
    with open(os.path.join(SHARED, "corpus", "kjv.jsonl.zst"), "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)


def write_corpus(path: str, mb: float) -> int:
    lines = kjv_lines()
    size = sum(len(x) for x in lines)
    copies = max(1, int(mb * 1e6 // size))
    with open(path, "wb") as f:
        for c in range(copies):
            for line in lines:
                f.write(line.replace(b'"id": "', f'"id": "{c}-'.encode(), 1))
    return os.path.getsize(path)


def write_small_docs(path: str, n: int) -> None:
    """n short generated documents (memory must not grow with their number)."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"document {i} says hello to {i * 7919 % 100003}"}) + "\n")


_ENGINE = None


def _init(kind: str) -> None:
    global _ENGINE
    os.environ["RAYON_NUM_THREADS"] = "1"
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(GPT2)
        tok.encode_special_tokens = True
        _ENGINE = lambda texts: tok.encode_batch(texts, add_special_tokens=False)  # noqa: E731
    else:
        from dataflow.preprocess.tokenizers import load_tokenizer

        enc = load_tokenizer(GPT2, engine="tiktoken")._enc
        _ENGINE = lambda texts: enc.encode_ordinary_batch(texts, num_threads=1)  # noqa: E731


def _encode(texts: list[str]) -> int:
    return sum(len(ids) for ids in _ENGINE(texts))


def raw_engine(kind: str, path: str, procs: int) -> float:
    """MB/s of the bare engine over the corpus texts (already parsed), `procs` processes."""
    with open(path, "rb") as f:
        texts = [json.loads(line)["text"] for line in f]
    chunks = [texts[i:i + 256] for i in range(0, len(texts), 256)]
    nbytes = sum(len(t.encode()) for t in texts)
    with mp.get_context("fork").Pool(procs, initializer=_init, initargs=(kind,)) as pool:
        pool.map(_encode, chunks[:procs])  # warm up
        t0 = time.perf_counter()
        pool.map(_encode, chunks, chunksize=4)
        return nbytes / 1e6 / (time.perf_counter() - t0)


def ours(path: str, out: str, workers: int, tokenizer: str = GPT2, engine: str = "auto") -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "dataflow", "tokenize", path, "-o", out, "--tokenizer", tokenizer, "--engine", engine,
           "--workers", str(workers), "--overwrite", "--no-progress", "--json", "--unit-size", "4MB"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(p.stderr)
    summary = json.loads(p.stdout)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"mb_per_s": os.path.getsize(path) / 1e6 / wall, "engine": summary["engine"], "wall_s": wall,
            "peak_rss_mb": max(rss, before) / 1024, "tokens": summary["tokens"]}


def peak_rss_of(path: str, out: str) -> float:
    """Peak RSS (MB) of the whole tokenize process tree, measured by the kernel via /usr/bin/time-like wait4."""
    cmd = [sys.executable, "-m", "dataflow", "tokenize", path, "-o", out, "--workers", "2", "--overwrite",
           "--no-progress", "--json", "--unit-size", "4MB"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(proc.stderr.read().decode())
    return usage.ru_maxrss / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100)
    p.add_argument("--docs", type=int, default=1_000_000, help="documents for the memory check (and 10x that)")
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "tokenize"))
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.docs = min(args.docs, 200_000)
    os.makedirs(args.work, exist_ok=True)
    corpus = os.path.join(args.work, "kjv.jsonl")
    size = write_corpus(corpus, args.mb)
    print(f"corpus: {size / 1e6:.0f} MB of JSONL (KJV replicated), GPT-2 tokenizer.json, {os.cpu_count()} CPUs")
    rows = {}
    for procs in (1, 2):
        rows[f"raw tokenizers encode_batch, {procs} proc"] = raw_engine("tokenizers", corpus, procs)
        rows[f"raw tiktoken encode_ordinary_batch, {procs} proc"] = raw_engine("tiktoken", corpus, procs)
        r = ours(corpus, os.path.join(args.work, f"out-{procs}"), procs)
        rows[f"dataflow tokenize --workers {procs} (engine {r['engine']})"] = r["mb_per_s"]
        r = ours(corpus, os.path.join(args.work, f"out-hf-{procs}"), procs, engine="hf")
        rows[f"dataflow tokenize --workers {procs} --engine hf"] = r["mb_per_s"]
    for name, mbs in rows.items():
        print(f"  {name:<52} {mbs:7.2f} MB/s")
    print("\nratios (same run)")
    for w in (1, 2):
        ours_t = rows[f"dataflow tokenize --workers {w} (engine tiktoken)"] if \
            f"dataflow tokenize --workers {w} (engine tiktoken)" in rows else None
        raw_t = rows[f"raw tiktoken encode_ordinary_batch, {w} proc"]
        raw_h = rows[f"raw tokenizers encode_batch, {w} proc"]
        ours_h = rows[f"dataflow tokenize --workers {w} --engine hf"]
        if ours_t:
            print(f"  {w} worker(s): ours (tiktoken) = {ours_t / raw_t:.2f}x raw tiktoken, {ours_t / raw_h:.2f}x raw "
                  f"tokenizers (the speed of tokenizers-bound pipelines)")
        print(f"  {w} worker(s): ours (--engine hf) = {ours_h / raw_h:.2f}x raw tokenizers")
    key = "dataflow tokenize --workers {} (engine tiktoken)"
    if key.format(1) in rows and key.format(2) in rows:
        print(f"  scaling 1 -> 2 workers: {rows[key.format(2)] / rows[key.format(1)]:.2f}x")
    small, big = os.path.join(args.work, "docs-1x.jsonl"), os.path.join(args.work, "docs-10x.jsonl")
    write_small_docs(small, args.docs)
    write_small_docs(big, 10 * args.docs)
    r1 = peak_rss_of(small, os.path.join(args.work, "mem-1x"))
    r10 = peak_rss_of(big, os.path.join(args.work, "mem-10x"))
    print(f"  peak RSS: {r1:.0f} MB for {args.docs:,} documents, {r10:.0f} MB for {10 * args.docs:,} "
          f"({r10 / r1:.2f}x for 10x the input)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
