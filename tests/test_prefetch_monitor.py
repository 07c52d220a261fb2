"""DevicePrefetcher (CPU path) and StarvationMonitor: order, errors, shutdown, overlap, wait accounting."""

import threading
import time

import pytest
import torch

from dataflow import DevicePrefetcher, StarvationMonitor


def slow_batches(n, delay=0.0):
    for i in range(n):
        if delay:
            time.sleep(delay)
        yield {"x": torch.full((2, 3), i)}


def test_order_and_values_with_slow_producer_and_consumer():
    got = []
    for b in DevicePrefetcher(slow_batches(20, 0.002), device="cpu", depth=3):
        time.sleep(0.001)
        got.append(int(b["x"][0, 0]))
    assert got == list(range(20))


def test_exception_reaches_consumer_with_its_message():
    def broken():
        yield {"x": torch.zeros(1)}
        raise ValueError("shard-00007.arrow is corrupt")

    it = iter(DevicePrefetcher(broken(), device="cpu"))
    next(it)
    with pytest.raises(ValueError, match="shard-00007.arrow is corrupt"):
        next(it)


def test_early_break_stops_the_thread():
    before = threading.active_count()
    pf = DevicePrefetcher(slow_batches(10_000), device="cpu", depth=2)
    for i, _ in enumerate(pf):
        if i == 3:
            break
    pf.close()
    time.sleep(0.1)
    assert threading.active_count() <= before


def test_overlap_hides_loading_behind_compute():
    n, delay = 20, 0.02
    t0 = time.perf_counter()
    for _ in DevicePrefetcher(slow_batches(n, delay), device="cpu", depth=2):
        time.sleep(delay)
    overlapped = time.perf_counter() - t0
    serial = 2 * n * delay
    assert overlapped < 0.75 * serial  # close to n*delay, far from the sum


def test_monitor_measures_injected_waits():
    mon = StarvationMonitor()
    wait, step, n = 0.02, 0.02, 15
    for _ in mon.wrap(slow_batches(n, wait)):
        with mon.step():
            time.sleep(step)
    s = mon.summary()
    assert s["steps"] == n
    assert s["data_wait_s"] == pytest.approx(n * wait, rel=0.5)
    ratio = s["data_wait_s"] / (s["step_s"] * n)
    assert 0.6 < ratio < 1.6  # equal injected waits and steps
    assert 30 < s["data_wait_pct"] < 70 and s["verdict"] == "input-bound"


def test_monitor_over_prefetcher_sees_no_wait_when_compute_bound():
    mon = StarvationMonitor()
    for _ in mon.wrap(DevicePrefetcher(slow_batches(15, 0.005), device="cpu", depth=2)):
        with mon.step():
            time.sleep(0.03)
    s = mon.summary()
    assert s["data_wait_pct"] < 15


def test_pinned_ring_allocates_once_per_slot_and_layout(monkeypatch):
    """The CUDA staging ring, exercised on CPU with pinning stubbed out: no allocation per batch."""
    from dataflow.loading.prefetch import PrefetchStats, _PinnedRing

    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    stats = PrefetchStats()
    ring = _PinnedRing(3, stats)
    batch = {"input_ids": torch.zeros(8, 16, dtype=torch.int64), "labels": torch.zeros(8, 16, dtype=torch.int64)}
    slots = set()
    for _ in range(50):
        i, slot = ring.take(batch)
        slots.add(id(slot["input_ids"]))
    assert stats.host_allocations == 3 and len(slots) == 3  # warm-up only, then reused
    ring.take({"input_ids": torch.zeros(3, 16, dtype=torch.int64)})  # a new layout (a last partial batch)
    assert stats.host_allocations == 4


def test_gpu_check_script_runs_dry_on_the_cpu(tmp_path):
    """tools/gpu_check.py is run once on a GPU machine, when one is lent: its loader and trainer parts
    must not fail there for a reason a CPU shows first."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, os.path.join(root, "tools", "gpu_check.py"), "--dry-run", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loader workers=2: wait" in p.stdout and "starvation:" in p.stdout
