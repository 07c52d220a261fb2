"""`dataflow profile`'s advice stays within the machine and names knobs the user can turn from where they are."""

from __future__ import annotations

import re

import pytest

from dataflow.profiling import advice
from dataflow.profiling.report import format_run


def result(workers: int, capacity: float, needed: float, dominant: str = "read") -> dict:
    return {"run": {"verdict": "input-bound", "data_wait_pct": 40.0, "wait_p99_ms": 90.0},
            "settings": {"num_workers": workers, "depth": 2, "prefetch_factor": 2, "device": "cpu"},
            "stages": {"dominant": dominant}, "headroom": capacity / needed,
            "capacity": {"batches_per_s": capacity}, "needed_batches_per_s": needed}


def flags_named(lines: list[str]) -> set[str]:
    return set(re.findall(r"--[a-z][a-z-]+", " ".join(lines)))


@pytest.mark.parametrize("cores", [1, 2, 4, 64])
def test_never_more_workers_than_cores(monkeypatch, cores):
    monkeypatch.setattr(advice, "usable_cores", lambda: cores)
    for workers, capacity, needed in [(1, 10.0, 35.0), (2, 5.0, 100.0), (0, 1.0, 3.0), (4, 40.0, 50.0)]:
        lines = advice.advise(result(workers, capacity, needed))
        suggested = [int(n) for n in re.findall(r"--num-workers (\d+)", " ".join(lines))]
        assert all(n <= cores for n in suggested), (cores, workers, lines)


def test_past_the_cores_it_says_cpu_is_missing(monkeypatch):
    monkeypatch.setattr(advice, "usable_cores", lambda: 2)
    lines = advice.advise(result(1, 10.0, 70.0))  # seven workers' worth
    text = " ".join(lines)
    assert "--num-workers 7" not in text and "more CPU than this machine has" in text
    assert "--num-workers 2" in text and "about 20.0" in text
    monkeypatch.setattr(advice, "usable_cores", lambda: 16)
    assert "--num-workers 9" in " ".join(advice.advise(result(1, 10.0, 70.0)))  # 7 x 1.25 margin, 16 cores


@pytest.mark.parametrize("stage", sorted(advice.STAGE_ADVICE))
def test_every_flag_advice_names_is_a_real_flag(stage):
    from dataflow.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    known = {opt for p in sub.choices.values() for a in p._actions for opt in a.option_strings}
    named = flags_named(advice.advise(result(1, 1.0, 4.0, dominant=stage)))
    assert named and named <= known, named - known


def test_the_decoded_cache_line_counts_shards_and_openings_apart():
    from dataflow import StarvationMonitor

    run = StarvationMonitor().summary()
    run.update(step_s=0.1, step_host_s=0.1, fetch_cpu_ms_per_batch=0.1)
    r = {"settings": {"num_workers": 2, "depth": 2, "prefetch_factor": 2, "device": "cpu"}, "startup_s": 0.5,
         "decode": {"shards_decoded": 6, "decode_hits": 12, "ms_per_shard": 40.0}, "run": run}
    line = next(x for x in format_run(r) if "decoded cache" in x)
    assert "6 zstd shard(s) decoded" in line and "12 shard opening(s)" in line
    assert "12 found decoded" not in line
