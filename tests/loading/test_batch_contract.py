"""The loader runtime's contract: a yielded batch never changes while referenced, whatever the consumer does;
errors reach the consumer; the position is tracked or refused, never silently lost.

Each test named after a defect failed on 26efe28 (the issue on the loader's batch contract).
"""

import gc
import json
import os
import random
import time
from collections import deque

import pytest
import torch

from support.data import write_counting_dataset
from dataflow import ConfigError, DataflowError, DevicePrefetcher, StreamingDataLoader, StreamingDataset

SEQ, B = 127, 4


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """Every window distinct: a counting token stream (the issue's repro data)."""
    return write_counting_dataset(tmp_path_factory.mktemp("contract"), 80_000, 100, "16KB")


def reference(path, **kw):
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1, **kw), batch_size=B)
    return [b["input_ids"].clone() for b in loader]


def wrapped(loader):
    yield from loader


@pytest.mark.parametrize("depth", [2, 4, 6])
def test_a_deeper_prefetcher_over_a_wrapped_loader_gets_intact_batches(path, depth):
    want = reference(path)
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=1)
    got = []
    for b in DevicePrefetcher(wrapped(loader), device="cpu", depth=depth):
        time.sleep(0.001)
        got.append(b["input_ids"].clone())
    assert len(got) == len(want)
    assert sum(not torch.equal(a, b) for a, b in zip(got, want)) == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_batches_kept_by_the_consumer_never_change(path, workers):
    want = reference(path)
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=workers)
    kept = list(loader)  # the user keeps every batch: the loader must not reuse their memory
    assert len(kept) == len(want)
    assert sum(not torch.equal(k["input_ids"], w) for k, w in zip(kept, want)) == 0
    assert loader.stats.copies > 0  # it handed out owned copies once every slot was held, and says so
    first = kept[0]["input_ids"][1:]  # a view of a view keeps its slot too
    del kept
    gc.collect()
    assert torch.equal(first, want[0][1:])


def test_slots_are_reused_once_the_consumer_drops_its_batches(path):
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=2)
    ptrs = set()
    for b in loader:
        ptrs.add(b["input_ids"].data_ptr())
    assert loader.stats.copies == 0
    assert 1 < len(ptrs) < 20 < len(loader)  # a handful of reused slots, not one allocation per batch


def test_prefetcher_on_cuda_without_cuda_fails_at_once_in_one_line(path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ), batch_size=B, num_workers=1, pin_memory=True)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="CUDA is not available") as e:
        DevicePrefetcher(loader, device="cuda")
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 5


def test_every_producer_error_reaches_the_consumer():
    def broken():
        yield {"x": torch.zeros(2)}
        raise ValueError("shard-00003.arrow: bad record batch")

    pf = DevicePrefetcher(broken(), device="cpu", depth=3)
    it = iter(pf)
    next(it)
    with pytest.raises(ValueError, match="shard-00003"):
        next(it)


def test_profile_counts_shard_open_time_once(path, tmp_path, monkeypatch):
    """A shard that takes 50 ms to fetch shows 50 ms of `fetch` per open, not twice that."""
    from dataflow.loading import storage
    from dataflow.profiling.recorder import StageRecorder, read_stage_events

    real = storage.Storage.local_path
    opens = tmp_path / "opens"
    opens.mkdir()

    def slow_fetch(self, info):
        time.sleep(0.05)
        (opens / f"{os.getpid()}-{time.perf_counter_ns()}").touch()
        return real(self, info)

    monkeypatch.setattr(storage.Storage, "local_path", slow_fetch)
    for workers in (0, 1):
        events_dir = tmp_path / f"events-{workers}"
        events_dir.mkdir()
        for f in opens.iterdir():
            f.unlink()
        ds = StreamingDataset(path, seq_len=SEQ, seed=1, shuffle_window=2, decode_once=False)  # every open fetches
        loader = StreamingDataLoader(ds, batch_size=B, num_workers=workers, stage_hook=StageRecorder(str(events_dir)))
        for _ in loader:
            pass
        n_opens = len(list(opens.iterdir()))
        fetch = sum(e["stages"]["fetch"] for e in read_stage_events(str(events_dir)))
        assert n_opens > 5
        assert 0.9 < fetch / (0.05 * n_opens) < 1.6, (workers, fetch, n_opens)
        assert loader.stage_seconds["fetch"] == pytest.approx(fetch, rel=0.05, abs=1e-3)


def test_torch_dataloader_with_workers_refuses_to_give_a_state(path):
    from torch.utils.data import DataLoader

    ds = StreamingDataset(path, seq_len=SEQ, seed=2)
    got = [tuple(r.tolist()) for b in DataLoader(ds, batch_size=B, num_workers=2) for r in b["input_ids"]]
    assert len(got) == len(set(got)) == ds.num_samples  # it serves every sample once...
    with pytest.raises(ConfigError, match="StreamingDataLoader"):
        ds.state_dict()  # ...but will not pretend to know where to resume


def test_torch_dataloader_without_workers_tracks_the_position(path):
    from torch.utils.data import DataLoader

    ds = StreamingDataset(path, seq_len=SEQ, seed=2)
    want = [b["input_ids"] for b in DataLoader(StreamingDataset(path, seq_len=SEQ, seed=2), batch_size=B)]
    it = iter(DataLoader(ds, batch_size=B))
    for _ in range(20):
        next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    assert state["consumed"] == 20 * B
    resumed = StreamingDataset(path, seq_len=SEQ, seed=2)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in DataLoader(resumed, batch_size=B)]
    assert len(rest) == len(want) - 20 and all(torch.equal(a, b) for a, b in zip(rest, want[20:]))


def test_a_second_iter_while_the_first_is_alive_continues_instead_of_hanging(path):
    want = reference(path)
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=2,
                                 timeout=30)
    it = iter(loader)
    first = next(it)["input_ids"].clone()
    rest = [b["input_ids"].clone() for b in loader]  # replaces `it`, continues after its batch
    assert len(rest) == len(want) - 1
    assert all(torch.equal(a, b) for a, b in zip([first, *rest], want))
    with pytest.raises(DataflowError, match="replaced by a newer iter"):
        next(it)


def test_persistent_workers_recover_after_a_worker_is_killed(path):
    import signal

    from dataflow import WorkerDied

    want = reference(path)
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=2,
                                 persistent_workers=True, timeout=30)
    got = []
    with pytest.raises(WorkerDied):
        for i, b in enumerate(loader):
            got.append(b["input_ids"].clone())
            if i == 3:
                os.kill(loader._pool.pids()[1], signal.SIGKILL)
                time.sleep(0.2)
    t0 = time.perf_counter()
    got += [b["input_ids"].clone() for b in loader]  # new workers, same position, no spin
    assert time.perf_counter() - t0 < 60
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetcher_iterated_again_after_a_break_loses_nothing(path, workers):
    want = reference(path)
    loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=workers)
    pf = DevicePrefetcher(loader, device="cpu", depth=3)
    got = []
    for stop in (6, 12, 10**9):
        for b in pf:
            got.append(b["input_ids"].clone())
            if len(got) == stop:
                time.sleep(0.05)  # the thread reads ahead meanwhile
                break
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("bad", [[], "x", {"version": 2}, {"version": 2, "epoch": -3, "consumed": 0, "seed": 1,
                                                                    "num_samples": 1, "seq_len": SEQ, "dataset": "x"}])
def test_malformed_resume_states_are_one_clear_error(path, bad):
    ds = StreamingDataset(path, seq_len=SEQ, seed=1)
    with pytest.raises(ConfigError, match="cannot resume"):
        ds.load_state_dict(bad)


def test_a_state_from_other_data_with_the_same_sample_count_is_refused(path, tmp_path):
    other = write_counting_dataset(tmp_path / "other", 80_000, 100, "16KB")
    import numpy as np

    from dataflow import ShardWriter, TokenizerMeta

    meta = TokenizerMeta(kind="hf", name="counting", vocab_size=65536, eos_id=65535)
    with ShardWriter(str(tmp_path / "shifted"), tokenizer_meta=meta, shard_size="16KB") as w:
        for doc in np.array_split((np.arange(80_000) + 7) % 65_000, 100):
            w.write(doc)
    state = StreamingDataset(path, seq_len=SEQ, seed=1).state_dict()
    StreamingDataset(other, seq_len=SEQ, seed=1).load_state_dict(state)  # the same bytes: accepted
    shifted = StreamingDataset(str(tmp_path / "shifted"), seq_len=SEQ, seed=1)
    assert shifted.num_samples == state["num_samples"]
    with pytest.raises(ConfigError, match="different data"):
        shifted.load_state_dict(state)


@pytest.mark.parametrize("weights", [{"a": float("nan"), "b": 1.0}, {"a": float("inf"), "b": 1.0},
                                     {"a": -1.0, "b": 1.0}, {"a": "heavy", "b": 1.0}])
def test_mixing_weights_must_be_finite_numbers(path, weights):
    with pytest.raises(ConfigError, match="mixing weights"):
        StreamingDataset({path if k == "a" else path + "/": v for k, v in weights.items()}, seq_len=SEQ)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shm() -> int:
    """/dev/shm entries this process made (torch names them torch_<pid>_...; the loader's rings are made
    here), not those of other jobs on the machine."""
    if not os.path.isdir("/dev/shm"):
        return 0
    return sum(f"_{os.getpid()}_" in name for name in os.listdir("/dev/shm"))


def test_randomized_consumers_always_see_the_reference_batches(path):
    """Workers 0/1/2, prefetch depth 1-8, the loader given directly or wrapped in a generator; consumers that
    keep k batches, sleep at random, break and restart: every batch equals the in-process reference, every
    kept batch still does when it is dropped, nothing hangs, and no fd or /dev/shm entry is left behind."""
    want = reference(path)
    rng = random.Random(12)

    def run(workers, depth, wrap, keep, persistent):
        loader = StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=workers,
                                     persistent_workers=persistent, timeout=60)
        pf = DevicePrefetcher(wrapped(loader) if wrap else loader, device="cpu", depth=depth)
        held: deque = deque()
        got = 0
        while got < len(want):
            stop_at = got + rng.randint(1, len(want))
            for batch in pf:
                assert torch.equal(batch["input_ids"], want[got]), (workers, depth, wrap, keep, got)
                held.append((got, batch))
                got += 1
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 0.003)
                while len(held) > keep:
                    i, old = held.popleft()
                    assert torch.equal(old["input_ids"], want[i]), ("a kept batch changed", workers, depth, i)
                if got >= stop_at:
                    break
        for i, old in held:
            assert torch.equal(old["input_ids"], want[i])
        pf.close()
        loader.close()

    run(2, 2, False, 3, True)  # warm-up: lazily created module state is not a leak
    gc.collect()
    fds, shm = _fds(), _shm()
    for _ in range(10):
        run(rng.choice([0, 1, 2]), rng.randint(1, 8), rng.random() < 0.5, rng.choice([0, 1, 3, 8, 40]),
            rng.random() < 0.5)
    gc.collect()
    assert _fds() <= fds and _shm() <= shm


def test_workers_leave_when_their_process_is_killed(path, tmp_path):
    """kill -9 of a training process leaves no loader worker behind (also when a thread started them)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "victim.py"
    script.write_text(
        "import sys, threading, time\n"
        "from dataflow import StreamingDataset, StreamingDataLoader\n"
        f"loader = StreamingDataLoader(StreamingDataset({path!r}, seq_len=16), batch_size=4, num_workers=2)\n"
        "it = iter(loader)\n"
        "threading.Thread(target=lambda: next(it)).start()\n"  # the pool is started by a thread that then ends
        "time.sleep(1.0)\n"
        "print(*loader._pool.pids(), flush=True)\n"
        "time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{pid}") for pid in pids)  # alive after their thread ended
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_len_is_this_ranks_samples_per_epoch_whatever_the_position(path):
    ds = StreamingDataset(path, seq_len=SEQ, seed=1, rank=1, world_size=3)
    n = len(ds)
    assert n == ds.num_samples // 3
    loader = StreamingDataLoader(ds, batch_size=B)
    it = iter(loader)
    for _ in range(10):
        next(it)
    assert len(ds) == n and len(loader) == n // B


def test_random_access_returns_the_stored_sample(path):
    ds = StreamingDataset(path, seq_len=SEQ, seed=1)
    first, last = ds[0], ds[len(ds) - 1]
    assert torch.equal(first["input_ids"], torch.arange(SEQ)) and torch.equal(first["labels"], torch.arange(1, SEQ + 1))
    assert torch.equal(ds[-1]["input_ids"], last["input_ids"])
    windows = {tuple(b["input_ids"][i].tolist()) for b in StreamingDataLoader(ds, batch_size=B, drop_last=False)
               for i in range(len(b["input_ids"]))}
    assert all(tuple(ds[i]["input_ids"].tolist()) in windows for i in range(0, len(ds), 37))
    with pytest.raises(IndexError, match="outside"):
        ds[len(ds)]
    docs = StreamingDataset(path)
    assert docs[1]["id"] and torch.equal(docs[0]["tokens"][:3], torch.arange(3))
    with pytest.raises(ConfigError, match="mix"):
        StreamingDataset({path: 1.0, path + "/": 1.0}, seq_len=SEQ)[0]


def test_a_dataset_or_loader_that_can_yield_nothing_says_why_at_construction(path):
    with pytest.raises(ConfigError, match="lower seq_len"):
        StreamingDataset(path, seq_len=100_000)
    ds = StreamingDataset(path, seq_len=SEQ)
    with pytest.raises(ConfigError, match="fewer than one batch"):
        StreamingDataLoader(ds, batch_size=len(ds) + 1)
    assert len(StreamingDataLoader(ds, batch_size=len(ds) + 1, drop_last=False)) == 1


def test_print_monitor_is_one_line():
    from dataflow import StarvationMonitor

    mon = StarvationMonitor()
    for _ in mon.wrap(iter([1, 2, 3])):
        with mon.step():
            pass
    text = str(mon)
    assert "\n" not in text and text.startswith("starvation:") and mon.summary()["steps"] == 3


class FailOnce(StreamingDataset):
    """Fails filling the batch that starts at sample `fail_at` while `marker` exists (once: it is removed)."""

    marker = ""
    fail_at = -1

    def fill(self, ids, out, epoch=None):
        if ids[0] == self.fail_at and os.path.exists(self.marker):
            os.remove(self.marker)
            raise OSError("injected read error")
        return super().fill(ids, out, epoch)


def test_a_failure_read_ahead_and_never_taken_costs_the_worker_no_slot(path, tmp_path):
    """The error of a batch the consumer never reached is dropped with the iteration; the worker's slot
    permit must come back with it, or a later consumer that keeps its batches waits forever."""
    want = reference(path)
    FailOnce.marker, FailOnce.fail_at = str(tmp_path / "fail"), B  # batch 1 of the epoch
    open(FailOnce.marker, "w").close()
    loader = StreamingDataLoader(FailOnce(path, seq_len=SEQ, seed=1), batch_size=B, num_workers=1, prefetch_factor=1,
                                 held_batches=0, persistent_workers=True, timeout=20)
    it = iter(loader)
    first = next(it)["input_ids"].clone()
    deadline = time.monotonic() + 20
    while os.path.exists(FailOnce.marker):  # the worker reads ahead into the failure
        assert time.monotonic() < deadline
        time.sleep(0.01)
    it.close()
    rest = [b["input_ids"] for b in loader]  # keeps every batch: copies once the slots are lent
    assert [first, *rest] and len(rest) == len(want) - 1
    assert all(torch.equal(a, b) for a, b in zip([first, *rest], want))
    loader.close()


def test_prefetcher_iterators_replace_each_other_and_an_ended_stream_is_not_read_twice(path):
    want = reference(path)
    pf = DevicePrefetcher(StreamingDataLoader(StreamingDataset(path, seq_len=SEQ, seed=1), batch_size=B), device="cpu")
    a = iter(pf)
    got = [next(a)["input_ids"].clone()]
    b = iter(pf)  # replaces `a`, continuing after its batch
    got.append(next(b)["input_ids"].clone())
    del a
    gc.collect()
    got += [x["input_ids"].clone() for x in b]
    assert len(got) == len(want) and all(torch.equal(x, y) for x, y in zip(got, want))
    counts = []
    for _ in range(2):  # the next epochs, each whole: no empty iteration in between
        counts.append(sum(1 for _ in pf))
    assert counts == [len(want), len(want)]
