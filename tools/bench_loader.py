"""Loader throughput: ours against the raw np.memmap reader (the ceiling) and torch's DataLoader.

Batches of 8 windows of 2049 tokens (seq_len 2048) as int64, shuffle on. The corpus is the KJV
tokenized with GPT-2, replicated to --tokens. Prints tokens/s (median of --repeats, min-max) and
ratios against the baselines measured in the same run, because absolute times on shared machines
are noise.

    python tools/bench_loader.py --tokens 200e6            # the full run
    python tools/bench_loader.py --tokens 20e6 --quick     # a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
B, L = 8, 2048


def prepare(work: str, tokens: float) -> dict[str, str]:
    """GPT-2-tokenized KJV, replicated: as zstd Arrow, plain Arrow, tar.zst, and a flat .bin for memmap."""
    paths = {"zstd": f"{work}/arrow-zstd", "none": f"{work}/arrow-none", "tar": f"{work}/tar-zstd",
             "bin": f"{work}/tokens.bin"}
    if all(os.path.exists(os.path.join(p, "index.json")) or p.endswith(".bin") and os.path.exists(p)
           for p in paths.values()):
        return paths
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    base = f"{work}/kjv-gpt2"
    if not os.path.exists(os.path.join(base, "index.json")):
        tokenize(TokenizeConfig(inputs=[f"{SHARED}/corpus/kjv.jsonl.zst"], out=base,
                                tokenizer=f"{SHARED}/tokenizers/gpt2/tokenizer.json", workers=2, progress=False))
    m = read_manifest(base)
    docs = [(i, t) for i, t in iter_documents(base, m)]
    copies = max(1, int(tokens // m.tokens))
    writers = {k: ShardWriter(paths[k], tokenizer_meta=m.tokenizer, format="tar" if k == "tar" else "arrow",
                              compression="none" if k == "none" else "zstd", shard_size="64MB") for k in ("zstd", "none", "tar")}
    with open(paths["bin"], "wb") as flat:
        for c in range(copies):
            for doc_id, toks in docs:
                for w in writers.values():
                    w.write(toks, id=f"{c}-{doc_id}")
                flat.write(toks.astype(np.uint16).tobytes())
    for w in writers.values():
        w.close()
    return paths


def memmap_reader(path: str, batches: int):
    """nanoGPT's get_batch: random windows from a memmap, stacked as int64."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(0)
    for _ in range(batches):
        ix = rng.integers(0, len(data) - (L + 1), B)
        yield torch.from_numpy(np.stack([data[i:i + L + 1].astype(np.int64) for i in ix]))


class MemmapWindows(torch.utils.data.Dataset):
    def __init__(self, path: str):
        self.path, self.data = path, None
        self.n = os.path.getsize(path) // 2 // (L + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.data is None:
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        return torch.from_numpy(self.data[i * L:i * L + L + 1].astype(np.int64))


def timed(make, batches: int, repeats: int) -> dict:
    """tokens/s over `batches` batches (median of repeats), time to first batch, main-process CPU/batch."""
    rates, firsts, cpus = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c0 = time.process_time()
        it = iter(make())
        n = 0
        first = None
        for batch in it:
            if first is None:
                first = time.perf_counter() - t0
                t1, c1 = time.perf_counter(), time.process_time()
            n += 1
            if n >= batches:
                break
        dt = time.perf_counter() - t1
        cpus.append((time.process_time() - c1) / max(n - 1, 1))
        close = getattr(it, "close", None)
        if close:
            close()
        rates.append((n - 1) * B * (L + 1) / dt)
        firsts.append(first)
    return {"tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "first_batch_s": statistics.median(firsts), "main_cpu_ms_per_batch": 1e3 * statistics.median(cpus)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=200e6)
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "loader"))
    p.add_argument("--batches", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.quick:
        args.batches, args.repeats = 400, 3
    paths = prepare(args.work, args.tokens)
    n = args.batches
    ours = lambda path, workers: lambda: StreamingDataLoader(  # noqa: E731
        StreamingDataset(path, seq_len=L, seed=0), batch_size=B, num_workers=workers)
    cases = {
        "memmap get_batch (ceiling, in-process)": lambda: memmap_reader(paths["bin"], n + 1),
        "dataflow zstd Arrow, in-process": ours(paths["zstd"], 0),
        "dataflow plain Arrow, in-process": ours(paths["none"], 0),
        "dataflow tar.zst, in-process": ours(paths["tar"], 0),
        "torch DataLoader memmap, 2 workers": lambda: torch.utils.data.DataLoader(
            MemmapWindows(paths["bin"]), batch_size=B, shuffle=True, num_workers=2),
        "dataflow zstd Arrow, 2 workers": ours(paths["zstd"], 2),
        "dataflow plain Arrow, 2 workers": ours(paths["none"], 2),
    }
    results = {}
    for name, make in cases.items():
        results[name] = r = timed(make, n, args.repeats)
        print(f"{name:<42} {r['tokens_per_s'] / 1e6:7.1f}M tok/s ({r['min'] / 1e6:.0f}-{r['max'] / 1e6:.0f})  "
              f"first batch {r['first_batch_s']:.3f} s  main CPU {r['main_cpu_ms_per_batch']:.3f} ms/batch", flush=True)
    ceiling = results["memmap get_batch (ceiling, in-process)"]["tokens_per_s"]
    torch_dl = results["torch DataLoader memmap, 2 workers"]
    print("\nratios (same run)")
    for name in ("dataflow zstd Arrow, in-process", "dataflow plain Arrow, in-process", "dataflow tar.zst, in-process"):
        print(f"  {name:<40} {results[name]['tokens_per_s'] / ceiling:5.2f}x the memmap ceiling")
    for name in ("dataflow zstd Arrow, 2 workers", "dataflow plain Arrow, 2 workers"):
        r = results[name]
        print(f"  {name:<40} {r['tokens_per_s'] / torch_dl['tokens_per_s']:5.2f}x torch DataLoader (2 workers), "
              f"{r['tokens_per_s'] / ceiling:4.2f}x the ceiling, main CPU/batch "
              f"{r['main_cpu_ms_per_batch'] / max(torch_dl['main_cpu_ms_per_batch'], 1e-9):.2f}x torch's")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; "
          f"bytes on disk: " + ", ".join(f"{k} {sum(s.bytes for s in read_manifest(v).shards) / 1e6:.0f} MB"
                                         for k, v in paths.items() if k != "bin"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
