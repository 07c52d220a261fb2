"""The loading runtime's doors as types: the `SampleSource` contract, the cursor as the one owner of the
position, `locate()` without side effects, and states saved by d25c0a6 that still resume."""

import json
import pathlib
import pickle

import numpy as np
import pytest
import torch

from dataflow import DevicePrefetcher, StreamingDataLoader, StreamingDataset
from dataflow.errors import ConfigError, DataflowError
from dataflow.loading.contract import BatchSource, FillReport, SampleSource
from dataflow.loading.cursor import Cursor
from dataflow.loading.stages import STAGES, TOTALS
from support.data import write_counting_dataset

OLD = pathlib.Path(__file__).resolve().parents[1] / "old_states" / "d25c0a6"  # dataset and states written by d25c0a6
L, B, N = 8, 4, 42


class ArangeSource:
    """A `SampleSource` that is not a `StreamingDataset`: global sample i of epoch e is the row
    (perm_e(i) * 100 + 0, 1, ..., L-1), so every batch and its epoch can be checked exactly."""

    seq_len = L

    def __init__(self, n: int = N):
        self.n = n
        self.cursor = Cursor(seed=0, num_samples=n, seq_len=L, fingerprint="arange")

    @property
    def num_samples(self) -> int:
        return self.n

    def rank_world(self):
        return 0, 1

    def describe(self) -> str:
        return "arange"

    def batch_layout(self, batch_size):
        return {"input_ids": ((batch_size, L), np.int64)}

    def value(self, i, epoch):
        return (i * 5 + epoch) % self.n  # a permutation of the epoch's samples (gcd(5, 42) = 1)

    def fill(self, ids, out, epoch):
        out["input_ids"][:len(ids)] = self.value(np.asarray(ids), epoch)[:, None] * 100 + np.arange(L)
        return FillReport({"collate": 1e-6}, {})

    def documents(self, ids, epoch):
        raise ConfigError("no documents here")

    def close(self, wait=True):
        pass


def expected(src, epoch, start=0):
    ids = np.arange(start, src.n - (src.n - start) % B)
    return [src.value(ids[i:i + B], epoch)[:, None] * 100 + np.arange(L) for i in range(0, len(ids), B)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_source_that_is_no_streaming_dataset_drives_the_loader_end_to_end(workers):
    src = ArangeSource()
    assert isinstance(src, SampleSource) and isinstance(src, BatchSource)
    loader = StreamingDataLoader(src, batch_size=B, num_workers=workers, cycle=True)
    it = iter(loader)
    first = [next(it)["input_ids"].numpy().copy() for _ in range(len(loader) + 3)]  # into the second epoch
    want = expected(src, 0) + expected(src, 1)[:3]
    assert all(np.array_equal(a, b) for a, b in zip(first, want, strict=True))
    assert loader.stage_seconds["collate"] > 0  # the report's seconds reached the loader's figures
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 3 * B)
    it.close()
    loader.close()

    resumed_src = ArangeSource()
    resumed = StreamingDataLoader(resumed_src, batch_size=B, num_workers=workers)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].numpy().copy() for b in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(rest, expected(src, 1, start=3 * B), strict=True))
    assert (resumed_src.cursor.epoch, resumed_src.cursor.consumed) == (2, 0)


def test_a_state_of_other_data_is_refused_by_the_cursor():
    loader = StreamingDataLoader(ArangeSource(), batch_size=B)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match="num_samples"):
        StreamingDataLoader(ArangeSource(n=41), batch_size=B).load_state_dict(state)


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("contract"), 30_000, 40, "8KB")


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    a = write_counting_dataset(tmp_path_factory.mktemp("mix-a"), 20_000, 20, "8KB")
    b = write_counting_dataset(tmp_path_factory.mktemp("mix-b"), 12_000, 20, "8KB")
    return {a: 0.6, b: 0.4}


def test_fill_reports_stage_seconds_and_counts_apart(counting):
    ds = StreamingDataset(counting, seq_len=L, seed=2)
    out = {k: np.empty(shape, dtype) for k, (shape, dtype) in ds.batch_layout(B).items()}
    report = ds.fill(ds.plan(B).sample_ids(0), out, 0)
    assert isinstance(report, FillReport)
    assert set(report.seconds) == set(STAGES) and set(report.counts) == set(TOTALS)
    assert report.counts["shards_decoded"] >= 1  # a count, not seconds

    timings = []
    loader = StreamingDataLoader(StreamingDataset(counting, seq_len=L, seed=2), batch_size=B, stage_hook=timings.append)
    next(iter(loader))
    assert set(timings[0].seconds) == set(STAGES) and set(timings[0].counts) == set(TOTALS)


@pytest.mark.parametrize("source", ["one", "mix"])
def test_locate_changes_nothing(counting, mix, source):
    ds = StreamingDataset(counting if source == "one" else mix, seq_len=L, seed=2, shuffle_window=2)
    loader = StreamingDataLoader(ds, batch_size=B)
    it = iter(loader)
    next(it)  # some shards open, some blocks current
    before = pickle.dumps(ds)
    far = np.arange(ds.num_samples - 2 * B, ds.num_samples)
    ds.locate(far)
    ds.locate(far, epoch=3)
    assert pickle.dumps(ds) == before
    it.close()


def test_the_position_is_the_cursors_and_read_only_on_the_dataset(counting):
    ds = StreamingDataset(counting, seq_len=L, seed=2)
    loader = StreamingDataLoader(ds, batch_size=B)
    it = iter(loader)
    next(it)
    assert (ds.epoch, ds.consumed) == (ds.cursor.epoch, ds.cursor.consumed) == (0, B)
    assert loader.state_dict() == ds.state_dict() == ds.cursor.state_dict()
    for name in ("epoch", "consumed"):
        with pytest.raises(AttributeError):
            setattr(ds, name, 0)
    it.close()


@pytest.mark.parametrize("jump", ["load_state_dict", "set_epoch"])
def test_a_jump_on_the_dataset_stops_an_unfinished_loader_iterator(counting, jump):
    ds = StreamingDataset(counting, seq_len=L, seed=2)
    loader = StreamingDataLoader(ds, batch_size=B)
    start = ds.state_dict()
    it = iter(loader)
    next(it)
    next(it)
    if jump == "load_state_dict":
        ds.load_state_dict(start)
    else:
        ds.set_epoch(3)
    moved_to = ds.state_dict()
    with pytest.raises(DataflowError, match="replaced"):
        next(it)
    assert ds.state_dict() == moved_to  # the stale iterator wrote nothing


def test_a_stale_iterator_at_the_end_of_its_epoch_does_not_turn_the_epoch(counting):
    ds = StreamingDataset(counting, seq_len=L, seed=2)
    loader = StreamingDataLoader(ds, batch_size=B)
    start = loader.state_dict()
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    loader.load_state_dict(start)
    with pytest.raises(StopIteration):
        next(it)
    assert loader.state_dict() == start


def _old():
    return json.loads((OLD / "states.json").read_text())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_state_saved_by_d25c0a6_resumes_the_same_batches(workers):
    old = _old()
    loader = StreamingDataLoader(StreamingDataset(str(OLD / "dataset"), seq_len=16, seed=3, shuffle_window=2),
                                 batch_size=4, num_workers=workers)
    loader.load_state_dict(old["state"])
    assert [b["input_ids"][:, 0].tolist() for b in loader] == old["rest_first_tokens"]


def test_the_loader_state_of_a_d25c0a6_trainer_checkpoint_resumes_through_the_prefetcher():
    """What trainer_state.json keeps under "loader" (`DevicePrefetcher.state_dict()` of d25c0a6, taken
    in the second epoch with 2 workers), loaded the way `trainer/loop.py` resumes."""
    old = _old()
    loader = StreamingDataLoader(StreamingDataset(str(OLD / "dataset"), seq_len=16, seed=3, shuffle_window=2),
                                 batch_size=4, num_workers=2, cycle=True)
    prefetcher = DevicePrefetcher(loader, device=torch.device("cpu"), depth=2)
    prefetcher.load_state_dict(old["trainer_loader_state"])
    it = iter(prefetcher)
    got = [next(it)["input_ids"][:, 0].tolist() for _ in range(len(old["trainer_next_first_tokens"]))]
    assert got == old["trainer_next_first_tokens"]
    prefetcher.close()


class Lender:
    """A `LendingLoader` that is no StreamingDataLoader: records the room a prefetcher asks for."""

    pinned = False

    def __init__(self):
        self.reserved = 0

    def reserve_held(self, batches):
        self.reserved = max(self.reserved, batches)

    def __iter__(self):
        return iter([{"x": torch.zeros(2)}] * 3)


def test_the_prefetcher_asks_any_lending_loader_for_room_through_the_contract(counting):
    lender = Lender()
    assert len(list(DevicePrefetcher(lender, device="cpu", depth=3))) == 3
    assert lender.reserved == 5  # depth + 2: what its queue and the consumer hold at once
    loader = StreamingDataLoader(StreamingDataset(counting, seq_len=L), batch_size=B, num_workers=1, held_batches=0)
    DevicePrefetcher(loader, device="cpu", depth=4)
    assert loader.held_batches == 6


def test_a_local_datasets_copy_never_carries_a_limit_a_first_decode_measured(counting, tmp_path):
    """A local dataset's default cache_limit is measured at its first decode, which a fetch-ahead thread may do
    at any moment: a copy (a worker's, a pickle) carries none of it, so what is sent never depends on timing."""
    ds = StreamingDataset(counting, seq_len=L, seed=2, cache_dir=str(tmp_path / "cache"))  # no decoded copy yet
    before = pickle.dumps(ds)
    ds[0]  # the first decode: the limit is measured now
    assert ds.storages[0].cache_limit is not None
    assert pickle.dumps(ds) == before
