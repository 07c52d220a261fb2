"""One case of `tools/bench_remote.py` in this (fresh) process, for any loader: a cold first epoch, then (where
the loader resumes) a resume at half an epoch on a fresh cache. The same clock and the same measures for every
loader; the loader itself comes from an adapter (`make`, `windows`, `close`; `state_dict` and `load_state_dict`
where it `resumes`).

Between the two parts it prints {"mark": "resume"} and waits for a line on stdin, so the parent can read the
proxy's counters of the cold part alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from typing import Any, Protocol

import numpy as np

from tools.peers.remote_samples import BATCH, SEQ, hash_rows, resume_verdict, verdict


class Adapter(Protocol):
    """A loader under test; one that `resumes` also has `state_dict(loader)` and `load_state_dict(loader, state)`."""

    resumes: bool
    same_cache_on_resume: bool  # its state names the cache folder: a fresh cache is the same folder, emptied

    def make(self, cache: str) -> Any: ...
    def windows(self, batch: Any) -> np.ndarray: ...
    def close(self, loader: Any) -> None: ...


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


class Poll:
    """Peak RSS of this process tree and peak bytes under each cache folder, every 20 ms."""

    def __init__(self, caches: list[str]):
        self.peak = self.cache_peak = 0
        self._caches, self._stop = caches, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss(os.getpid()))
            self.cache_peak = max(self.cache_peak, max(_folder_bytes(c) for c in self._caches))
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()


def _epoch(adapter: Adapter, cache: str, half: int, state: Any = None) -> dict:
    """Make the loader (loading `state` when given), read its epoch; the state after `half` batches."""
    t0 = time.perf_counter()
    loader = adapter.make(cache)
    opened = time.perf_counter() - t0
    if state is not None:
        adapter.load_state_dict(loader, state)
    it = iter(loader)
    hashes = [hash_rows(adapter.windows(next(it)))]
    first = time.perf_counter() - t0
    out: dict = {"state": None, "before": 0}
    for batch in it:
        hashes.append(hash_rows(adapter.windows(batch)))
        if len(hashes) == half and state is None and adapter.resumes:
            out["state"], out["before"] = adapter.state_dict(loader), len(hashes)
    out.update(open_s=opened, first_s=first, epoch_s=time.perf_counter() - t0, hashes=np.concatenate(hashes),
               batches=len(hashes))
    adapter.close(loader)
    return out


def warm(spec: dict, adapter: Adapter) -> dict:
    """One batch, untimed (the parent's warm-up of this interpreter), its cache removed."""
    cache = os.path.join(spec["cache"], "warm")
    loader = adapter.make(cache)
    adapter.windows(next(iter(loader)))
    adapter.close(loader)
    shutil.rmtree(spec["cache"], ignore_errors=True)
    return {"warm": True}


def run(spec: dict, adapter: Adapter) -> dict:
    """The case's figures and the check of what it served (`spec["expected"]`: the sorted window hashes)."""
    expected = np.load(spec["expected"])
    cold_cache = os.path.join(spec["cache"], "cold")
    resumed_cache = cold_cache if adapter.same_cache_on_resume else os.path.join(spec["cache"], "resumed")
    poll = Poll([cold_cache, resumed_cache])
    half = len(expected) // BATCH // 2
    cold = _epoch(adapter, cold_cache, half)
    slack = BATCH * max(1, spec["workers"])
    out = {k: cold[k] for k in ("open_s", "first_s", "epoch_s", "batches")}
    out.update(tokens=cold["batches"] * BATCH * SEQ, samples=verdict(cold["hashes"], expected, slack),
               first_resumed_s=None, resume="n/a")
    print(json.dumps({"mark": "resume"}), flush=True)
    sys.stdin.readline()
    if adapter.resumes:
        if cold["state"] is None:
            raise RuntimeError(f"the epoch ended before half of it ({half} batches) was served")
        if adapter.same_cache_on_resume:
            shutil.rmtree(cold_cache, ignore_errors=True)
        rest = _epoch(adapter, resumed_cache, half, state=cold["state"])
        before = cold["hashes"][:cold["before"] * BATCH]
        out.update(first_resumed_s=rest["first_s"], rest_batches=rest["batches"],
                   resume=resume_verdict(before, rest["hashes"], cold["hashes"]))
    poll.stop()
    out.update(peak_rss=poll.peak, cache_peak=poll.cache_peak)
    return out
