"""StarvationMonitor and `dataflow profile` report the warm-up apart from the steady state and judge the steady
state: one slow first batch (worker start-up, a cold cache) does not make a short run "input-bound".

The monitor runs on a simulated clock (waits and steps advance it, nothing sleeps): the figures are exact and
no load on the machine can move them.
"""

import json

import pytest
import torch

from support.data import write_random_dataset
from dataflow import StarvationMonitor
from dataflow.cli import main

STEP = 0.013  # seconds per step


def measured(waits, step=STEP, **kwargs):
    """The summary of a loop whose batch i waits waits[i] seconds and whose steps take `step`."""
    clock = {"now": 0.0}
    mon = StarvationMonitor(clock=lambda: clock["now"], cpu_clock=lambda: 0.0, **kwargs)

    def batches():
        for wait in waits:
            clock["now"] += wait
            yield {"input_ids": torch.zeros(2, 8, dtype=torch.long)}

    for _ in mon.wrap(batches()):
        with mon.step():
            clock["now"] += step
    return mon, mon.summary()


def test_one_slow_first_batch_is_warm_up_not_input_bound():
    """The issue's run: 20 steps of 13 ms after a 185 ms first batch is 41.6% data wait over the whole run."""
    mon, s = measured([0.185] + [0.0] * 19)
    assert s["steps"] == 20 and s["wall_s"] == pytest.approx(0.185 + 20 * STEP)
    assert s["data_wait_s"] == pytest.approx(0.185) and s["data_wait_pct"] == pytest.approx(41.6, abs=0.1)
    assert s["step_s"] == pytest.approx(STEP)  # the whole run's figures, as the contract has them
    assert s["warmup_steps"] == 5
    w, st = s["warmup"], s["steady"]
    assert w["steps"] == 5 and w["data_wait_s"] == pytest.approx(0.185)
    assert w["wall_s"] == pytest.approx(0.185 + 5 * STEP)
    assert st["steps"] == 15 and st["data_wait_s"] == 0 and st["data_wait_pct"] == 0
    assert st["wall_s"] == pytest.approx(15 * STEP) and st["step_s"] == pytest.approx(STEP)
    assert st["batches_per_s"] == pytest.approx(1 / STEP) and st["tokens_per_s"] == pytest.approx(16 / STEP)
    assert s["verdict"] == st["verdict"] == "compute-bound" and "steady" in s["verdict_basis"]
    line = mon.format_summary()
    assert "41.6%" in line and "warm-up" in line and "steady state" in line and "compute-bound" in line


def test_every_batch_slow_is_input_bound_in_the_steady_state_too():
    _, s = measured([0.01] * 20)
    assert s["steady"]["data_wait_pct"] == pytest.approx(100 * 0.01 / (0.01 + STEP))
    assert s["verdict"] == s["steady"]["verdict"] == "input-bound"


def test_a_slow_batch_after_the_warm_up_still_counts():
    _, s = measured([0.0] * 10 + [0.4] + [0.0] * 9)
    assert s["steady"]["data_wait_s"] == pytest.approx(0.4) and s["warmup"]["data_wait_s"] == 0
    assert s["verdict"] == "input-bound"
    assert s["steady"]["wait_p99_ms"] > 100  # percentiles of the steady batches


def test_warmup_steps_is_a_setting_and_zero_judges_the_whole_run():
    _, s = measured([0.185] + [0.0] * 19, warmup_steps=0)
    assert s["warmup"]["steps"] == 0 and s["steady"]["steps"] == 20
    assert s["verdict"] == "input-bound" and s["steady"]["data_wait_pct"] == pytest.approx(s["data_wait_pct"])
    _, s = measured([0.185, 0.185] + [0.0] * 18, warmup_steps=2)
    assert s["warmup"]["steps"] == 2 and s["verdict"] == "compute-bound"
    with pytest.raises(Exception, match="warmup_steps"):
        StarvationMonitor(warmup_steps=-1)


def test_a_run_no_longer_than_its_warm_up_is_judged_whole_and_says_so():
    mon, s = measured([0.185, 0.0, 0.0])
    assert s["steps"] == 3 and s["warmup"]["steps"] == 3 and s["steady"] is None
    assert s["verdict"] == "input-bound" and "whole run" in s["verdict_basis"]
    assert "no steady state" in mon.format_summary()


class _Event:
    """A CUDA event stand-in on the test's GPU clock; always complete."""

    gpu = {"now": 0.0}

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = self.gpu["now"]

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_on_cuda_the_copy_wait_and_gpu_step_time_split_at_the_warm_up_too(monkeypatch):
    """The first batch's copy keeps the GPU idle 185 ms while the host never blocks: copy wait, warm-up."""
    from types import SimpleNamespace

    from dataflow.profiling import gpu

    def timer():
        t = real_timer()
        t._torch = SimpleNamespace(cuda=SimpleNamespace(Event=_Event))
        return t

    real_timer = gpu.CudaTimer
    monkeypatch.setattr(gpu, "cuda_in_use", lambda device=None: True)
    monkeypatch.setattr(gpu, "CudaTimer", timer)
    host, _Event.gpu["now"] = {"now": 0.0}, 0.0
    mon = StarvationMonitor(clock=lambda: host["now"], cpu_clock=lambda: 0.0, nvml=False)

    def batches():
        for i in range(20):
            _Event.gpu["now"] += 0.185 if i == 0 else 0.0
            yield {"input_ids": torch.zeros(2, 8, dtype=torch.long)}

    for _ in mon.wrap(batches()):
        with mon.step():
            host["now"] += STEP
            _Event.gpu["now"] += STEP
    s = mon.summary()
    assert s["copy_wait_s"] == pytest.approx(0.185) and s["data_wait_pct"] > 50
    assert s["warmup"]["data_wait_s"] == pytest.approx(0.185) and s["steady"]["data_wait_s"] == pytest.approx(0)
    assert s["steady"]["step_s"] == pytest.approx(STEP) and s["step_timing"].startswith("cuda events")
    assert s["steady"]["wait_p99_ms"] == pytest.approx(0, abs=1e-6) and s["warmup"]["wait_p99_ms"] > 100
    assert s["verdict"] == "compute-bound"


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_random_dataset(tmp_path_factory.mktemp("profile-warmup") / "ds", 80, seed=3, min_len=100)


def test_dataflow_profile_shows_warm_up_and_steady_state(ds, capsys):
    args = ["profile", ds, "--batch-size", "4", "--seq-len", "64", "--num-workers", "0", "--step-ms", "2",
            "--batches", "12"]
    assert main(args + ["--json"]) == 0
    run = json.loads(capsys.readouterr().out)["result"]["run"]
    assert run["steps"] == 12 and run["warmup"]["steps"] == 5 and run["steady"]["steps"] == 7
    assert run["verdict"] == run["steady"]["verdict"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warm-up" in out and "steady state" in out and "first 5 steps" in out
