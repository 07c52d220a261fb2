"""The data-order audit's cost on the loader: the same run with and without `audit=DIR`, interleaved.

KJV (tests/data) as byte tokens, replicated to --tokens, batches of --batch-size x (--seq-len + 1); each
repeat runs one pass of --batches batches without the audit and one with it, in alternating order, and
the overhead is the ratio of the median times (wall, and the training process's CPU time, which a busy
machine disturbs less). Also the audit's own cost per step (record + its share of
the writes), timed alone, against the loader's time per batch.

    python tools/bench_audit.py                 # in-process and 2 workers
    python tools/bench_audit.py --workers 0 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def prepare(folder: str, tokens: int) -> str:
    import numpy as np
    import zstandard

    from dataflow import ShardWriter, TokenizerMeta
    from tools import repo_data

    out = os.path.join(folder, "kjv")
    with open(repo_data.KJV, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()
    docs = [np.frombuffer(json.loads(line)["text"].encode(), np.uint8).astype(np.uint16) for line in lines]
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    written = 0
    with ShardWriter(out, tokenizer_meta=meta, shard_size="16MB") as w:
        while written < tokens:
            for doc in docs:
                w.write(doc)
                written += len(doc)
    return out


def one_pass(data: str, args: argparse.Namespace, audit: str | None) -> tuple[float, float]:
    from dataflow import StreamingDataLoader, StreamingDataset

    loader = StreamingDataLoader(StreamingDataset(data, seq_len=args.seq_len), batch_size=args.batch_size,
                                 num_workers=args.workers, cycle=True, audit=audit)
    it = iter(loader)
    for _ in range(args.warmup):
        next(it)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        next(it)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    loader.close()
    return seconds, cpu


def step_cost(folder: str, steps: int = 200_000) -> float:
    """Seconds the audit adds per step on its own (a record, and its share of the line writes)."""
    from dataflow.audit.log import AuditLog
    from dataflow.loading.plan import BatchPlan

    plan = BatchPlan(0, 0, steps * 64, 0, 8, 8)
    state = {"version": 2, "epoch": 0, "consumed": 0, "seed": 0, "num_samples": steps * 64, "seq_len": 2048,
             "dataset": "bench"}
    log = AuditLog(folder, state, (0, 8, 2), batch_size=8, drop_last=True, source="bench")
    walk = log.walk(plan, "start")
    t0 = time.perf_counter()
    for _ in range(steps):
        log.step()
    log.end_walk(walk)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=float, default=20e6)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        data = prepare(tmp, int(args.tokens))
        per_step = step_cost(os.path.join(tmp, "alone"))
        print(f"audit alone: {per_step * 1e6:.2f} us per step")
        for workers in args.workers:
            args.workers = workers
            plain, audited = [], []
            for r in range(args.repeats):
                order = [None, os.path.join(tmp, f"audit-{workers}-{r}")]
                for audit in (order if r % 2 == 0 else order[::-1]):
                    (plain if audit is None else audited).append(one_pass(data, args, audit))
            a, b = (statistics.median(p[0] for p in runs) for runs in (plain, audited))
            ca, cb = (statistics.median(p[1] for p in runs) for runs in (plain, audited))
            print(json.dumps({"workers": workers, "batches": args.batches, "plain_s": round(a, 4),
                              "audit_s": round(b, 4), "overhead_pct": round(100 * (b - a) / a, 2),
                              "main_cpu_overhead_pct": round(100 * (cb - ca) / ca, 2),
                              "batch_ms": round(1e3 * a / args.batches, 3),
                              "audit_share_pct": round(100 * per_step / (a / args.batches), 3)}))


if __name__ == "__main__":
    main()
