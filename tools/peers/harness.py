"""Runs one tool in this process, for tools/bench_loader.py and tools/bench_tokenize.py.

    python tools/peers/harness.py loader-prepare PEER --work DIR
    python tools/peers/harness.py loader-run PEER SETTING --workers N --work DIR --batches N --repeats R --out F
    python tools/peers/harness.py tokenize-run PEER --workers N --work DIR --out F

Loader runs: one untimed warm-up pass, then `repeats` timed passes; each pass builds a fresh loader
(so time to first batch includes starting its workers) and takes `batches` batches or stops after
`max_seconds`. tokens/s counts B x (L + 1) tokens per batch after the first one.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root: `tools.peers...`

from tools.peers.common import B, L, W, Ctx  # noqa: E402


def peer(name: str):
    return importlib.import_module(f"tools.peers.{name}_peer")


def check(batch) -> None:
    """The batch is 8 windows of int64 tokens, whatever container the tool yields."""
    if isinstance(batch, dict) and "labels" in batch:  # ours: input_ids and labels, shifted by one
        t = batch["input_ids"]
        ok = tuple(t.shape) == (B, L) and tuple(batch["labels"].shape) == (B, L)
    elif isinstance(batch, dict):
        t = batch["input_ids"]
        ok = tuple(t.shape) == (B, W)
    else:
        t = batch[0] if isinstance(batch, (list, tuple)) else batch
        ok = tuple(t.shape) == (B, W)
    if not ok or str(t.dtype) != "torch.int64":
        raise AssertionError(f"unexpected batch: {type(batch).__name__} {getattr(t, 'shape', None)} {t.dtype}")


def _self_cpu_s() -> float:
    """CPU seconds of this (the training) process, all its threads: what loading steals from the training loop."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one_pass(make, batches: int, max_seconds: float) -> dict:
    t0 = time.perf_counter()
    loader = make()
    it = iter(loader)
    first = None
    n = 0
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
            check(batch)
            t1, c1 = time.perf_counter(), _self_cpu_s()
        n += 1
        if n >= batches or time.perf_counter() - t1 > max_seconds:
            break
    dt, cpu = time.perf_counter() - t1, _self_cpu_s() - c1
    if first is None:
        raise RuntimeError("the loader yielded no batch")
    if n < 2:
        raise RuntimeError("the loader yielded a single batch")
    for obj in (it, loader):
        close = getattr(obj, "close", None) or getattr(obj, "_shutdown_workers", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down is not what is measured
                pass
    del it, loader, batch
    gc.collect()
    return {"rate": (n - 1) * B * W / dt, "first": first, "batches": n, "main_cpu": cpu / (n - 1)}


def loader_run(a) -> dict:
    mod = peer(a.peer)
    ctx = Ctx(a.work)
    make = lambda: mod.make(ctx, a.setting, a.workers)  # noqa: E731
    one_pass(make, min(a.batches, 50), a.max_seconds)  # untimed: page cache, imports, lazy state
    passes = [one_pass(make, a.batches, a.max_seconds) for _ in range(a.repeats)]
    rates = [p["rate"] for p in passes]
    return {"tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "first_batch_s": statistics.median(p["first"] for p in passes),
            "main_cpu_ms": 1e3 * statistics.median(p["main_cpu"] for p in passes),
            "batches": [p["batches"] for p in passes], "describe": mod.describe(a.setting, a.workers),
            "disk_bytes": mod.disk_bytes(ctx, a.setting)}


def digest(docs) -> dict:
    """Documents (token arrays, EOS removed) as a multiset: count, tokens, and a digest of their sorted hashes.
    Two tools gave identical ids for every document iff their digests are equal, whatever their order."""
    import hashlib

    import numpy as np

    hashes, tokens = [], 0
    for d in docs:
        d = np.asarray(d).astype(np.uint32)
        tokens += len(d)
        hashes.append(hashlib.sha1(d.tobytes()).hexdigest()[:16])
    hashes.sort()
    return {"docs": len(hashes), "tokens": tokens, "digest": hashlib.sha256("".join(hashes).encode()).hexdigest(),
            "hashes": hashes}


def _cpu_s() -> float:
    import resource

    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


class _ChildCPU:
    """CPU seconds of this process's descendants, sampled from /proc while the tool runs: pool workers that a tool
    ends without waiting for them never reach RUSAGE_CHILDREN."""

    def __init__(self):
        import threading

        from tools.peers.procs import _children

        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self._children = _children
        self.tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.1):
            todo = self._children(os.getpid())
            while todo:
                pid = todo.pop()
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    self.last[pid] = (int(fields[11]) + int(fields[12])) / self.tick
                except (OSError, IndexError, ValueError):
                    continue
                todo += self._children(pid)

    def total(self) -> float:
        self.stop.set()
        self.thread.join()
        return sum(self.last.values())


def tokenize_run(a) -> dict:
    import resource

    mod = peer(a.peer)
    c0, self0 = _cpu_s(), resource.getrusage(resource.RUSAGE_SELF)
    sampler = _ChildCPU()
    r = mod.tokenize(a.work, a.workers, a.setting)
    sampled = sampler.total()
    if a.peer != "raw_tokenizers":  # CPU of this process and of its worker processes during the tool's call
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        own = self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime
        r["cpu_s"] = max(_cpu_s() - c0, own + sampled)
    if callable(r.get("docs")):
        r.update(digest(r.pop("docs")()))
    with open(a.out + ".hashes.json", "w") as f:
        json.dump(r.pop("hashes"), f)
    return r


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("loader-prepare", "loader-run", "tokenize-run"))
    p.add_argument("peer")
    p.add_argument("setting", nargs="?")
    p.add_argument("--work", required=True)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--out")
    a = p.parse_args()
    try:
        if a.what == "loader-prepare":
            mod = peer(a.peer)
            mod.prepare(Ctx(a.work))
            return 0
        r = loader_run(a) if a.what == "loader-run" else tokenize_run(a)
        with open(a.out, "w") as f:
            json.dump(r, f)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator, which writes it in the table
        traceback.print_exc()
        msg = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"error": msg}, f)
        return 1


if __name__ == "__main__":
    sys.exit(main())
