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


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dataflow-prefetch" and t.is_alive()]


def test_early_break_stops_the_thread():
    before = set(_prefetch_threads())
    pf = DevicePrefetcher(slow_batches(10_000), device="cpu", depth=2)
    for i, _ in enumerate(pf):
        if i == 3:
            break
    pf.close()
    mine = [t for t in _prefetch_threads() if t not in before]
    for t in mine:
        t.join(timeout=30)  # close() stopped it: it ends at once; the timeout only bounds a failing run
    assert not [t for t in mine if t.is_alive()]


def test_overlap_loads_the_next_batch_while_the_consumer_computes():
    """Causal, not timed: while the consumer holds batch i, the producer must already make batch i+1. A
    prefetcher that loaded only on demand would never set the event, and the wait would time out."""
    produced = [threading.Event() for _ in range(12)]

    def batches():
        for i in range(12):
            yield {"x": torch.full((2, 3), i)}
            produced[i].set()  # runs when the next batch is asked for: i has been handed over

    for b in DevicePrefetcher(batches(), device="cpu", depth=2):
        i = int(b["x"][0, 0])
        if i + 1 < 12:  # "computing" on batch i: the producer is already past it
            assert produced[i].wait(timeout=30), f"batch {i + 1} was not prefetched during step {i}"


def test_monitor_measures_injected_waits():
    clock = {"now": 0.0}
    mon = StarvationMonitor(clock=lambda: clock["now"])
    wait, step, n = 0.02, 0.03, 15

    def batches():
        for i in range(n):
            clock["now"] += wait
            yield {"x": torch.full((2, 3), i)}

    for _ in mon.wrap(batches()):
        with mon.step():
            clock["now"] += step
    s = mon.summary()
    assert s["steps"] == n
    assert s["data_wait_s"] == pytest.approx(n * wait) and s["step_s"] == pytest.approx(step)
    assert s["data_wait_pct"] == pytest.approx(40.0) and s["verdict"] == "input-bound"


def test_monitor_over_prefetcher_sees_no_wait_when_compute_bound():
    """Each step lasts until the prefetcher holds the next batch (and 0.1 s at least): every next() finds a
    batch ready, so the measured wait is a tiny share of the step time, however loaded the machine is."""
    ready = [threading.Event() for _ in range(11)]

    def batches():
        for i in range(10):
            yield {"x": torch.full((2, 3), i)}
            ready[i].set()

    mon = StarvationMonitor()
    pf = DevicePrefetcher(batches(), device="cpu", depth=2)
    for b in mon.wrap(pf):
        with mon.step():
            i = int(b["x"][0, 0])
            assert i == 9 or ready[i].wait(timeout=30)
            time.sleep(0.1)
    s = mon.summary()
    assert s["steps"] == 10 and s["data_wait_pct"] < 15


def test_staging_slots_allocate_once_per_slot_and_layout(monkeypatch):
    """The CUDA staging slots, exercised on CPU with pinning stubbed out: no allocation per batch."""
    from dataflow.loading.prefetch import PrefetchStats, _StagingSlots

    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    stats = PrefetchStats()
    staging = _StagingSlots(3, stats)
    batch = {"input_ids": torch.zeros(8, 16, dtype=torch.int64), "labels": torch.zeros(8, 16, dtype=torch.int64)}
    slots = set()
    for _ in range(50):
        i, slot = staging.take(batch)
        slots.add(id(slot["input_ids"]))
    assert stats.host_allocations == 3 and len(slots) == 3  # warm-up only, then reused
    staging.take({"input_ids": torch.zeros(3, 16, dtype=torch.int64)})  # a new layout (a last partial batch)
    assert stats.host_allocations == 4


def test_gpu_check_script_runs_dry_on_the_cpu(tmp_path):
    """tools/gpu_check.py is run once on a GPU machine, when one is lent: its loader and trainer parts
    must not fail there for a reason a CPU shows first."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, os.path.join(root, "tools", "gpu_check.py"), "--dry-run", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loader workers=2: wait" in p.stdout and "starvation:" in p.stdout
    assert "tp 1 weights equal" in p.stdout  # the tensor-parallel path, through the trainer's own code
