"""StarvationMonitor: injected waits and steps come back as measured, CPU fetch time, upstream stage figures.

The accounting is checked exactly on a simulated clock (waits and steps advance it, nothing sleeps), so a
loaded machine cannot move a figure; the real clocks are checked with lower bounds only (a sleep never
returns early, a busy loop never uses less CPU than it counted), which load cannot break either.
"""

import math
import time
from types import SimpleNamespace

import pytest
import torch

from dataflow import StarvationMonitor
from dataflow.loading.contract import StageSnapshot
from dataflow.profiling.overhead import measure_overhead

SLOW = {2: 0.06, 5: 0.04, 9: 0.08}  # batch index -> injected load delay (s)
STEP = 0.03


class SimClock:
    """Wall and CPU clocks that move only when the test says time passed."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def sleep(self, seconds):
        self.wall += seconds

    def work(self, seconds):
        self.wall += seconds
        self.cpu += seconds

    def monitor(self) -> StarvationMonitor:
        return StarvationMonitor(clock=lambda: self.wall, cpu_clock=lambda: self.cpu)


def fake_loader(clock, n, slow=SLOW, tokens=(4, 16)):
    for i in range(n):
        if i in slow:
            clock.sleep(slow[i])
        yield {"input_ids": torch.zeros(tokens, dtype=torch.long), "i": i}


def run(clock, mon, batches, step=STEP):
    for _ in mon.wrap(batches):
        with mon.step():
            clock.sleep(step)
    return mon.summary()


def test_injected_waits_and_data_wait_share_are_measured():
    n, clock = 12, SimClock()
    s = run(clock, clock.monitor(), fake_loader(clock, n))
    injected_wait, injected_steps = sum(SLOW.values()), n * STEP
    assert s["steps"] == s["batches"] == n
    assert s["data_wait_s"] == pytest.approx(injected_wait)
    assert s["wall_s"] == pytest.approx(injected_wait + injected_steps)
    assert s["data_wait_pct"] == pytest.approx(100 * injected_wait / (injected_wait + injected_steps))
    assert s["step_s"] == pytest.approx(STEP)
    assert s["verdict"] == "input-bound" and "10%" in s["verdict_rule"]
    # the slow batches are the tail of the wait distribution; the others waited nothing
    assert s["wait_p99_ms"] / 1e3 / max(SLOW.values()) > 0.5
    assert s["wait_p50_ms"] == pytest.approx(0.0)
    assert s["tokens"] == n * 64 and s["tokens_per_s"] == pytest.approx(n * 64 / s["wall_s"])
    assert s["batches_per_s"] == pytest.approx(n / s["wall_s"])


def test_real_clocks_never_undercount_injected_waits_and_steps():
    mon = StarvationMonitor()
    for _ in mon.wrap(time.sleep(0.02) or i for i in range(5)):
        with mon.step():
            time.sleep(0.01)
    s = mon.summary()
    assert s["steps"] == 5 and s["data_wait_s"] >= 5 * 0.02 and s["step_s"] >= 0.01
    assert s["wall_s"] >= s["data_wait_s"] + 5 * 0.01


def test_compute_bound_loop_and_summary_keys():
    clock = SimClock()
    s = run(clock, clock.monitor(), fake_loader(clock, 8, slow={}), step=0.02)
    assert s["data_wait_pct"] == 0 and s["verdict"] == "compute-bound"
    for key in ("steps", "wall_s", "data_wait_s", "data_wait_pct", "step_s", "wait_p50_ms", "wait_p90_ms",
                "wait_p99_ms", "batches_per_s", "tokens_per_s", "fetch_cpu_s", "verdict", "verdict_rule"):
        assert key in s
    assert s["gpu"]["available"] is False and "CUDA" in s["gpu"]["reason"]  # absent, not zeros
    assert s["stages"] is None  # a plain generator has no stage figures


def test_fetch_cpu_time_tells_busy_loading_from_blocked_waiting():
    def batches(clock, n, seconds, busy):
        for i in range(n):
            (clock.work if busy else clock.sleep)(seconds)
            yield i

    clock = SimClock()
    b = run(clock, clock.monitor(), batches(clock, 5, 0.03, busy=True), step=0.0)
    clock = SimClock()
    z = run(clock, clock.monitor(), batches(clock, 5, 0.03, busy=False), step=0.0)
    assert b["fetch_cpu_s"] == pytest.approx(0.15) == b["data_wait_s"]  # the process itself worked for them
    assert z["fetch_cpu_s"] == 0 and z["data_wait_s"] == pytest.approx(0.15)  # it only waited


def test_fetch_cpu_time_on_the_real_clock_counts_at_least_the_work_done():
    def busy(n, seconds):  # a fixed amount of CPU work, however loaded the machine is
        for i in range(n):
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
            yield i

    b = run(SimClock(), StarvationMonitor(), busy(5, 0.03), step=0.0)
    assert b["fetch_cpu_s"] >= 0.15 and b["data_wait_s"] >= 0.15


def test_reset_interval_reports_each_interval():
    clock = SimClock()
    mon = clock.monitor()
    mon.reset_interval()
    batches = mon.wrap(fake_loader(clock, 4, slow={0: 0.05, 3: 0.05}))
    for i in range(2):
        next(batches)
        with mon.step():
            clock.sleep(0.02)
    wait1, wall1 = mon.reset_interval()
    for i in range(2):
        next(batches)
        with mon.step():
            clock.sleep(0.02)
    wait2, wall2 = mon.reset_interval()
    assert wait1 == pytest.approx(0.05) and wait2 == pytest.approx(0.05)
    assert wall1 == pytest.approx(0.09) and wall2 == pytest.approx(0.09)


def test_reset_window_still_works_but_warns_it_is_now_reset_interval():
    """The old name (before "window" meant only the shuffle window) keeps working, with a DeprecationWarning,
    and shares its interval with `reset_interval`: the two may be mixed during a migration."""
    clock = SimClock()
    mon = clock.monitor()
    with pytest.warns(DeprecationWarning, match="reset_interval"):
        mon.reset_window()
    batches = mon.wrap(fake_loader(clock, 4, slow={0: 0.05, 2: 0.07}))
    for _ in range(2):
        next(batches)
        with mon.step():
            clock.sleep(0.02)
    wait1, wall1 = mon.reset_interval()
    next(batches)
    with pytest.warns(DeprecationWarning):
        wait2, wall2 = mon.reset_window()
    assert (wait1, wall1) == (pytest.approx(0.05), pytest.approx(0.09))
    assert (wait2, wall2) == (pytest.approx(0.07), pytest.approx(0.07))  # one batch, no step since


class FakeLoader:
    """A loader double keeping the StageFigures contract: stage seconds that restart (a new worker pool) mid-run."""

    def __init__(self, n):
        self.n, self.totals = n, {}

    def stage_figures(self):
        return StageSnapshot(dict(self.totals), sources={"loader": type(self).__name__})

    def __iter__(self):
        for i in range(self.n):
            if i == self.n // 2:
                self.totals = {}  # a new pool: its counters start from zero
            for k, v in (("read", 0.004), ("shuffle", 0.001), ("collate", 0.002)):
                self.totals[k] = self.totals.get(k, 0.0) + v
            yield {"input_ids": torch.zeros(2, 8, dtype=torch.long)}


class FakePrefetcher:
    """A prefetcher double: iterates its upstream, lays its own figures over the upstream's (StageFigures)."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.stats = SimpleNamespace(batches=0, wait_s=0.0)

    def stage_figures(self):
        own = StageSnapshot(transfer={"batches": float(self.stats.batches), "wait_s": 0.0},
                            sources={"prefetcher": type(self).__name__}, device="cpu")
        return own.over(self.upstream.stage_figures())

    def __iter__(self):
        for b in self.upstream:
            self.stats.batches += 1
            yield b


def test_wrap_finds_loader_and_prefetcher_upstream_and_keeps_restarted_counters():
    prefetcher = FakePrefetcher(FakeLoader(10))
    mon = StarvationMonitor()
    for _ in mon.wrap(prefetcher):
        with mon.step():
            pass
    st = mon.summary()["stages"]
    seconds = {r["stage"]: r["seconds"] for r in st["stages"]}
    assert seconds["read"] == pytest.approx(10 * 0.004)
    assert seconds["collate"] == pytest.approx(10 * 0.002)
    assert st["dominant"] == "read"
    assert st["sources"]["loader"] == "FakeLoader"


def test_overhead_benchmark_reports_a_per_step_figure():
    r = measure_overhead(steps=2000, repeats=2)
    assert math.isfinite(r["overhead_us_per_step"]) and r["overhead_us_per_step"] >= 0
    assert r["monitored_us_per_step"] >= r["bare_us_per_step"] * 0.5


class FakeClock:
    now = 0.0


class FakeEvent:
    """A CUDA event stand-in: records the fake GPU clock; always complete."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = FakeClock.now

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_cuda_timer_accounting_with_fake_events():
    from dataflow.profiling.gpu import CudaTimer

    timer = CudaTimer()
    timer._torch = SimpleNamespace(cuda=SimpleNamespace(Event=FakeEvent))
    mon = StarvationMonitor()
    mon.cuda = timer
    FakeClock.now = 0.0
    timer.before_fetch()
    FakeClock.now = 0.010  # the GPU was idle 10 ms until the batch's copy was done; the host waited 4 ms
    timer.after_fetch(0.004)
    timer.step_start()
    FakeClock.now = 0.035
    timer.step_end()
    assert timer.copy_wait_total == pytest.approx(0.006)
    assert timer.step_total == pytest.approx(0.025) and timer.steps == 1
    assert len(timer._free) == 4  # events are reused, not allocated per step
    s = mon.summary()
    assert s["copy_wait_s"] == pytest.approx(0.006) and s["step_s"] == pytest.approx(0.025)
    assert s["step_timing"].startswith("cuda events")
    assert s["gpu"]["available"] is False and s["gpu"]["reason"]


def test_nvml_sampler_says_why_it_is_absent():
    from dataflow.profiling.gpu import NvmlSampler

    sampler = NvmlSampler()
    sampler.stop()
    g = sampler.summary()
    if not g["available"]:
        assert g["reason"]  # e.g. nvidia-ml-py not installed, or no driver: never zeros
