"""Peak memory of `dataflow tokenize` does not grow with the input: 1x vs 10x the documents.

Generates N and 10*N short JSONL documents, tokenizes each with 2 workers, and prints the peak RSS
of the whole process tree (the kernel's figure for the main process and its waited-for workers).
Every document holds distinct numbers, so a BPE engine that caches pieces (gigatoken) meets ever
new ones: its cache is what would grow with the input, and what the engine's memory bound caps.

    python tools/bench_tokenize_memory.py --docs 1000000      # 1M vs 10M documents, 8MB shards
    python tools/bench_tokenize_memory.py --tokenizer bytes   # without a BPE engine
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_docs(path: str, n: int) -> int:
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": f"document {i} says hello to {i * 7919 % 100003}"}) + "\n")
        os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def peak_rss_mb(path: str, out: str, workers: int, shard_size: str, unit_size: str,
                tokenizer: str) -> tuple[float, float]:
    """(peak RSS of the tokenize process tree in MB, seconds)."""
    cmd = [sys.executable, "-m", "dataflow", "tokenize", path, "-o", out, "--workers", str(workers),
           "--tokenizer", tokenizer,
           "--shard-size", shard_size, "--unit-size", unit_size, "--overwrite", "--no-progress", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(proc.stderr.read().decode())
    # wait4 reports the largest RSS of the child and of the workers it waited for (Linux: RUSAGE_BOTH)
    return usage.ru_maxrss / 1024, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tokenizer", default=None, help="default: GPT-2's tokenizer.json shipped in tests/data")
    # Memory is bounded by one open shard and a few units in flight: both runs must be large enough to
    # reach those bounds (1M short documents do not fill a 128MB shard), hence smaller defaults here.
    p.add_argument("--shard-size", default="8MB")  # 1M short documents are ~13M GPT-2 tokens: > 1 shard
    p.add_argument("--unit-size", default="8MB")
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "tokenize-memory"))
    args = p.parse_args()
    if args.tokenizer is None:
        sys.path.insert(0, ROOT)
        from tools.repo_data import gpt2_json

        args.tokenizer = str(gpt2_json())
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for factor in (1, 10):
        n = factor * args.docs
        path = os.path.join(args.work, f"docs-{n}.jsonl")
        size = write_docs(path, n)
        rss, secs = peak_rss_mb(path, os.path.join(args.work, f"out-{n}"), args.workers, args.shard_size,
                                args.unit_size, args.tokenizer)
        rows.append((n, size, rss, secs))
        print(f"{n:>12,} documents ({size / 1e6:7.1f} MB): peak RSS {rss:7.1f} MB, {secs:6.1f} s", flush=True)
    print(f"peak RSS for 10x the input: {rows[1][2] / rows[0][2]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
