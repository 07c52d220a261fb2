"""Stage breakdown: an injected slow decompress or slow collate is attributed to its stage; the sweep
recommends more workers for a loader that cannot keep up. Ratios of injected sleeps only, each far larger
than what the other stages cost on a loaded machine."""

import time

import pytest

from support.data import write_random_dataset
from dataflow import StarvationMonitor, StreamingDataLoader, StreamingDataset
from dataflow.loading.shards import OpenShard
from dataflow.profiling.consumers import sleeper
from dataflow.profiling.session import RunSettings, run_config
from dataflow.profiling.sweep import parse_sweep, recommend, sweep
from dataflow.errors import ConfigError

@pytest.fixture(scope="module")
def small_ds(tmp_path_factory):
    return write_random_dataset(tmp_path_factory.mktemp("profile") / "ds", 120, seed=0, min_len=200)


def slow_reads(monkeypatch, seconds):
    """Every sample read (decompressed record batches -> tokens) sleeps: inherited by forked workers."""
    original = OpenShard.token_run

    def token_run(self, start, length):
        time.sleep(seconds)
        return original(self, start, length)

    monkeypatch.setattr(OpenShard, "token_run", token_run)


@pytest.fixture
def slow_decompress(monkeypatch):
    slow_reads(monkeypatch, 0.02)  # 80 ms per batch of 4: far above any other stage, even on a loaded machine


@pytest.fixture
def slow_loader(monkeypatch):
    slow_reads(monkeypatch, 0.02)  # 40 ms per batch of 2: slower than the 25 ms step unless >= 2 workers


def read_seconds(stages: dict) -> float:
    return next(row["seconds"] for row in stages["stages"] if row["stage"] == "read")


# The injected sleeps are a floor no load can lower: the read stage must hold them (batches x 4 samples
# x 20 ms). That read also *dominates* is a wall-clock claim a stalled machine can break
# (a second-long stall inside another stage's timer once did in CI): hence `timing` (rerun on failure).
@pytest.mark.timing
@pytest.mark.parametrize("workers", [0, 1])
def test_profile_attributes_slow_decompress_to_read(small_ds, slow_decompress, workers):
    s = RunSettings(small_ds, batch_size=4, seq_len=64, num_workers=workers, batches=10, warmup=2)
    r = run_config(s, sleeper(5), capacity=False)
    st = r["stages"]
    assert read_seconds(st) >= 8 * 4 * 0.02  # of the 10 measured batches, the window's edges may cut one or two
    assert st["dominant"] == "read"
    shares = {row["stage"]: row["share_pct"] for row in st["stages"]}
    assert shares["read"] > 3 * max(shares["shuffle"], shares["collate"], shares["fetch"])
    tracks = list(st["per_worker"])
    assert tracks == (["worker-0"] if workers else tracks) and tracks
    if not workers:
        assert tracks[0].startswith("main")


@pytest.mark.timing
def test_monitor_wrapping_the_loader_reports_its_stages(small_ds, slow_decompress):
    ds = StreamingDataset(small_ds, seq_len=64)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=1)
    mon = StarvationMonitor()
    batches = mon.wrap(loader)
    for i, _ in enumerate(batches):
        with mon.step():
            pass
        if i == 9:
            break
    batches.close()
    loader.close()
    st = mon.summary()["stages"]
    assert st["sources"]["loader"] == "StreamingDataLoader"
    assert read_seconds(st) >= 10 * 4 * 0.02 and st["per_worker"]["worker-0"]["read"] >= 10 * 4 * 0.02
    assert st["dominant"] == "read"


@pytest.mark.timing  # three workers must outpace one on wall time: real parallel sleeps, fork and start-up
def test_sweep_recommends_more_workers_for_a_slow_loader(small_ds, slow_loader):
    base = RunSettings(small_ds, batch_size=2, seq_len=32, num_workers=0, batches=16)
    out = sweep(base, {"num_workers": [0, 1, 3]}, sleeper(25))
    waits = {row["num_workers"]: row["data_wait_pct"] for row in out["rows"]}
    assert waits[0] > 2 * waits[3] and waits[1] > 2 * waits[3]
    assert out["recommendation"]["settings"]["num_workers"] == 3
    assert {row["dominant_stage"] for row in out["rows"]} == {"read"}


def test_recommend_prefers_fewest_workers_then_smallest_depth():
    def res(w, d, pct, mem=1.0):
        return {"settings": {"num_workers": w, "depth": d, "prefetch_factor": 2}, "run": {"data_wait_pct": pct},
                "memory_estimate_mb": mem}
    rows = [res(4, 1, 0.2), res(2, 4, 0.5), res(2, 2, 0.9), res(1, 1, 30.0)]
    rec = recommend(rows)
    assert rec["settings"] == {"num_workers": 2, "depth": 2, "prefetch_factor": 2} and rec["met_target"]
    rec = recommend([res(1, 1, 30.0), res(2, 1, 5.0)])
    assert not rec["met_target"] and rec["settings"]["num_workers"] == 2


def test_parse_sweep_rejects_mistakes():
    assert parse_sweep(["num_workers=2,0,1", "depth=1,2"]) == {"num_workers": [0, 1, 2], "depth": [1, 2]}
    for bad in (["threads=1,2"], ["num_workers"], ["depth=0,1"], ["depth=a"]):
        with pytest.raises(ConfigError):
            parse_sweep(bad)
