"""Worker hand-off through the shared slot ring: order, no per-batch allocation, failures, shutdown."""

import os
import signal
import time

import pytest
import torch

from support.data import write_counting_dataset
from dataflow import DataflowError, StreamingDataLoader, StreamingDataset
from dataflow import WorkerDied

SEQ = 32


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("handoff"), 60_000, 200, "16KB")


class SlowDataset(StreamingDataset):
    """Sleeps in the worker while collating: a slow producer."""

    delay = 0.0
    fail_at_batch = None

    def fill(self, ids, out, epoch=None):
        if self.fail_at_batch is not None and ids[0] >= self.fail_at_batch * 4:
            raise ValueError(f"injected failure reading sample {ids[0]}")
        time.sleep(self.delay)
        return super().fill(ids, out, epoch)


def reference(ds_path, n=None):
    ds = StreamingDataset(ds_path, seq_len=SEQ, seed=5)
    return [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=4)][:n]


@pytest.mark.parametrize("delay,consumer_delay", [(0.005, 0.0), (0.0, 0.005)])
def test_values_and_order_through_the_ring(ds_path, delay, consumer_delay):
    want = reference(ds_path, 60)
    ds = SlowDataset(ds_path, seq_len=SEQ, seed=5)
    ds.delay = delay
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    for i, b in enumerate(loader):
        if i == 60:
            break
        time.sleep(consumer_delay)
        assert torch.equal(b["input_ids"], want[i])


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _shm(pids=()):
    """/dev/shm entries made by this process or `pids` (torch names them torch_<pid>_...): other jobs on
    the machine may come and go."""
    if not os.path.isdir("/dev/shm"):
        return 0
    mine = {f"_{p}_" for p in (os.getpid(), *pids)}
    return sum(any(m in name for m in mine) for name in os.listdir("/dev/shm"))


def test_no_per_batch_allocation_after_warm_up(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ, seed=5, shuffle_window=2)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    worker_fds, main_fds, shm = [], set(), set()
    for i, b in enumerate(loader):
        if i >= 20 and i % 10 == 0:
            worker_fds.append(sum(_fds(p) for p in loader._pool.pids()))
            main_fds.add(_fds(os.getpid()))
            shm.add(_shm(loader._pool.pids()))
    assert len(worker_fds) > 30
    assert len(main_fds) == 1 and len(shm) == 1  # nothing new per batch in the main process or /dev/shm
    # workers open only the shards of their shuffle window (2 per worker: a lock and a map each) and the next
    # window's while it is decoded ahead; never a segment or a file per batch (there are hundreds)
    assert max(worker_fds) - min(worker_fds) <= 2 * 2 * 2 * 2


def test_batch_memory_is_the_preallocated_ring(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    ptrs = set()
    slots = None
    for i, b in enumerate(loader):
        slots = loader._pool.ring.slots
        ring = loader._pool.ring.buffer
        lo, hi = ring.data_ptr(), ring.data_ptr() + ring.numel()
        assert lo <= b["input_ids"].data_ptr() < hi
        ptrs.add(b["input_ids"].data_ptr())
        if i == 100:
            break
    assert 1 < len(ptrs) <= slots  # 100 batches through a handful of reused slots


def test_worker_exception_reaches_the_user(ds_path):
    ds = SlowDataset(ds_path, seq_len=SEQ, shuffle=False)
    ds.fail_at_batch = 7
    with pytest.raises(ValueError, match="injected failure reading sample"):
        for _ in StreamingDataLoader(ds, batch_size=4, num_workers=2):
            pass


def test_dead_worker_is_reported_not_a_hang(ds_path):
    ds = SlowDataset(ds_path, seq_len=SEQ)
    ds.delay = 0.01
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    with pytest.raises(WorkerDied, match="died"):
        for i, _ in enumerate(loader):
            if i == 3:
                os.kill(loader._pool.pids()[1], signal.SIGKILL)


def test_a_stalled_worker_hits_the_timeout(ds_path):
    ds = SlowDataset(ds_path, seq_len=SEQ)
    ds.delay = 30.0
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, timeout=0.3)
    t0 = time.perf_counter()
    with pytest.raises(DataflowError, match="produced no batch in 0.3 s"):
        next(iter(loader))
    assert time.perf_counter() - t0 < 15.0  # far sooner than the stalled batch (workers stopped, not awaited)
    loader.close()


def test_break_and_persistent_workers(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ, seed=5)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    first = []
    for i, b in enumerate(loader):
        first.append(b["input_ids"])
        if i == 5:
            break
    pids = loader._pool.pids()
    rest = [b["input_ids"] for b in loader]  # resumes the same epoch after the break, same worker processes
    assert loader._pool.pids() == pids
    want = reference(ds_path)
    got = first + rest
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    loader.close()
    assert loader._pool is None


def test_persistent_workers_serve_consecutive_epochs(ds_path):
    """The same worker processes go from one finished epoch to the next (their slots and semaphores reset)."""
    plain = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4)
    want = [[b["input_ids"] for b in plain] for _ in range(2)]
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4, num_workers=2,
                                 persistent_workers=True)
    got = [[b["input_ids"] for b in loader] for _ in range(2)]
    assert not all(torch.equal(a, b) for a, b in zip(want[0], want[1]))  # epochs differ
    for g, w in zip(got, want):
        assert len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w))
    loader.close()


def test_spawned_workers_give_the_same_batches(ds_path):
    want = reference(ds_path, 12)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4, num_workers=2,
                                 multiprocessing_context="spawn")
    got = []
    for b in loader:
        got.append(b["input_ids"].clone())
        if len(got) == 12:
            break
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_forkserver_workers_wait_for_a_slow_consumer_and_survive_an_idle_pause(ds_path):
    # a forkserver worker's parent is the fork server: it once took that for its loader's death and quit
    # whenever it waited for a free slot (a slow training step) or sat idle between epochs
    want = reference(ds_path, 12)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4, num_workers=2,
                                 multiprocessing_context="forkserver", persistent_workers=True)
    got = []
    for b in loader:
        got.append(b["input_ids"].clone())
        time.sleep(0.15)  # longer than a worker's wait for a free slot between its checks
        if len(got) == 6:
            break
    time.sleep(1.5)  # idle workers check on their parent every PARENT_CHECK_S
    got += [b["input_ids"].clone() for _, b in zip(range(6), loader)]
    assert all(torch.equal(a, b) for a, b in zip(got[:6], want[:6]))
    assert all(torch.equal(a, b) for a, b in zip(got[6:], want[6:]))
    loader.close()


def test_partial_last_batch_without_drop_last(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ)
    batches = list(StreamingDataLoader(ds, batch_size=7, num_workers=2, drop_last=False))
    assert sum(len(b["input_ids"]) for b in batches) == ds.num_samples
    assert len(batches[-1]["input_ids"]) == ds.num_samples % 7 or ds.num_samples % 7 == 0


def test_prefetcher_over_ring_batches_sees_intact_values(ds_path):
    from dataflow import DevicePrefetcher

    want = reference(ds_path)
    ds = SlowDataset(ds_path, seq_len=SEQ, seed=5)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    got = []
    for b in DevicePrefetcher(loader, device="cpu", depth=2):
        time.sleep(0.001)  # a consumer slower than the ring: batches must not be overwritten under it
        got.append(b["input_ids"].clone())
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_prefetcher_state_is_the_consumers_not_the_read_ahead(ds_path):
    from dataflow import DevicePrefetcher

    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4, num_workers=2)
    pf = DevicePrefetcher(loader, device="cpu", depth=2)
    for i, _ in enumerate(pf):
        if i == 9:
            time.sleep(0.2)  # let the thread read ahead
            state = pf.state_dict()
            break
    assert state["consumed"] == 10 * 4
    resumed = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=5), batch_size=4)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed))["input_ids"], want[10])
