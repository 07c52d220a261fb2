"""The profiler reads a pipeline only through the loading contract (`StageFigures`) and the stage hook:
no `upstream` links followed, no attribute names tried, no private attributes read."""

import ast
import pathlib
from types import SimpleNamespace

import pytest
import torch

from support.data import write_random_dataset
from dataflow import DevicePrefetcher, StarvationMonitor, StreamingDataLoader, StreamingDataset
from dataflow.errors import ConfigError
from dataflow.loading.contract import StageFigures, StageSnapshot

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_ds(tmp_path_factory):
    return write_random_dataset(tmp_path_factory.mktemp("contract") / "ds", 40, seed=1, min_len=100)


class Figures:
    """A pipeline part that keeps only the contract: `stage_figures()` and iteration, nothing else."""

    def __init__(self, n, per_batch):
        self.n, self.per_batch, self.seen = n, per_batch, {}

    def stage_figures(self):
        return StageSnapshot(dict(self.seen), {"worker-0": dict(self.seen)}, sources={"loader": "Double"})

    def __iter__(self):
        for _ in range(self.n):
            for k, v in self.per_batch.items():
                self.seen[k] = self.seen.get(k, 0.0) + v
            yield {"input_ids": torch.zeros(1, 4, dtype=torch.long)}


def _stages(mon, batches):
    for _ in mon.wrap(batches):
        with mon.step():
            pass
    return mon.summary()["stages"]


def test_a_contract_double_is_all_the_monitor_needs():
    st = _stages(StarvationMonitor(), Figures(6, {"read": 0.01, "collate": 0.002}))
    seconds = {r["stage"]: r["seconds"] for r in st["stages"]}
    assert seconds["read"] == pytest.approx(0.06) and st["dominant"] == "read"
    assert st["per_worker"]["worker-0"]["collate"] == pytest.approx(0.012)
    assert st["sources"]["loader"] == "Double" and st["sources"]["prefetcher"] is None


@pytest.mark.parametrize("link", ["upstream", "loader", "dataset"])
def test_no_attribute_is_followed_to_find_a_loader(small_ds, link):
    """A wrapper of your own that merely holds a loader (under any name) is not probed: it says what it
    wraps by keeping the contract, or you name it with `attach`."""
    loader = StreamingDataLoader(StreamingDataset(small_ds, seq_len=16), batch_size=2)

    class Wrapper:
        def __init__(self):
            setattr(self, link, loader)
            self.stats = SimpleNamespace(wait_s=0.0, batches=0)  # what a prefetcher used to be told by

        def __iter__(self):
            return iter(loader)

    assert _stages(StarvationMonitor(), Wrapper()) is None
    mon = StarvationMonitor()
    mon.attach(loader)
    assert _stages(mon, Wrapper())["sources"]["loader"] == "StreamingDataLoader"


@pytest.mark.parametrize("workers", [0, 1])
def test_the_prefetcher_lays_its_figures_over_the_loaders(small_ds, workers):
    loader = StreamingDataLoader(StreamingDataset(small_ds, seq_len=16), batch_size=2, num_workers=workers)
    pf = DevicePrefetcher(loader, depth=2)
    assert isinstance(pf, StageFigures) and isinstance(loader, StageFigures)
    try:
        st = _stages(StarvationMonitor(), pf)
        snap = pf.stage_figures()
    finally:
        pf.close()
        loader.close()
    assert snap.sources == {"loader": "StreamingDataLoader", "prefetcher": "DevicePrefetcher"}
    assert snap.device == "cpu" and "h2d_s" not in snap.transfer  # no copy on CPU: nothing timed
    assert snap.transfer["batches"] == len(loader) and snap.stages == loader.stage_seconds
    assert st["sources"]["loader"] == "StreamingDataLoader" and st["sources"]["prefetcher"] == "DevicePrefetcher"
    assert "h2d" not in {r["stage"] for r in st["stages"]} and st["recorded"]
    assert list(st["per_worker"] or {}) == (["worker-0"] if workers else [])


def test_over_takes_what_the_wrapper_lacks_from_below():
    below = StageSnapshot({"read": 1.0}, {"worker-0": {"read": 1.0}}, {"wait_s": 9.0}, {"loader": "L"}, None)
    top = StageSnapshot(transfer={"wait_s": 2.0}, sources={"prefetcher": "P"}, device="cuda:1")
    both = top.over(below)
    assert both == StageSnapshot({"read": 1.0}, {"worker-0": {"read": 1.0}}, {"wait_s": 2.0},
                                 {"loader": "L", "prefetcher": "P"}, "cuda:1")


@pytest.mark.parametrize("bad", [object(), iter([1, 2]), SimpleNamespace(stage_seconds={"read": 1.0})])
def test_attach_takes_only_what_keeps_the_contract(bad):
    with pytest.raises(ConfigError, match="StageFigures"):
        StarvationMonitor().attach(bad)
    with pytest.raises(ConfigError, match="prefetcher"):
        StarvationMonitor().attach(prefetcher=bad)


def test_decode_counts_come_from_the_stage_hook_records():
    from dataflow.profiling.recorder import decode_counts

    def ev(pid, t0, decoded, hits, cpu):
        return {"pid": pid, "t0": t0, "totals": {"shards_decoded": decoded, "decode_hits": hits, "decode_cpu_s": cpu}}

    # running totals per process: the latest of each process counts, then processes add up
    events = [ev(1, 0.0, 1, 0, 0.5), ev(2, 0.1, 0, 1, 0.0), ev(1, 0.3, 2, 1, 0.9), ev(2, 0.2, 1, 3, 0.2)]
    assert decode_counts(events) == {"shards_decoded": 3, "decode_hits": 4, "decode_cpu_s": pytest.approx(1.1)}
    assert decode_counts([]) == {"shards_decoded": 0, "decode_hits": 0, "decode_cpu_s": 0}


def _reads_of_others(path):
    """Private attributes read off objects other than `self` (and the names handed to getattr/hasattr)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner not in ("self", "mon"):  # mon: the monitor's own step helper, same module
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and name.value in ("upstream", "stats", "stage_seconds", "device",
                                                                 "stage_seconds_by_worker", "prefetcher", "loader"):
                found.append(f"{path.name}:{node.lineno} {node.func.id}(..., {name.value!r})")
            elif isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append(f"{path.name}:{node.lineno} {node.func.id}(..., {name.value!r})")
    return found


def test_profiling_reads_no_private_attribute_and_guesses_no_name():
    bad = [hit for p in sorted((ROOT / "dataflow" / "profiling").glob("*.py")) for hit in _reads_of_others(p)]
    assert not bad, "\n".join(bad)
