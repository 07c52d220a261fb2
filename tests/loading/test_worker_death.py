"""Any death of a loader worker, at any moment, is `WorkerDied` naming the worker and how it died.

Each test kills a worker at a chosen point (never a race against a timer): before its first job (the
pool's constructor is wrapped), while it fills a chosen batch (the dataset kills its own process), or
while a persistent pool sits idle between epochs. After the error, the next `iter()` starts new
workers at the same position.
"""

import faulthandler
import os
import signal

import pytest
import torch

from support.data import write_counting_dataset
from dataflow import StreamingDataLoader, StreamingDataset, WorkerDied
from dataflow.loading.handoff import WorkerPool

SEQ = 16


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("deaths"), 20_000, 60, "8KB")


class DyingDataset(StreamingDataset):
    """Ends its own worker process when asked to fill (or read) the sample `die_at`, the way given."""

    die_at = None
    how = ("signal", signal.SIGKILL)

    def _maybe_die(self, ids):
        if self.die_at is not None and self.die_at in set(ids.tolist()) and os.getpid() != self.main_pid:
            kind, value = self.how
            if kind == "signal":
                faulthandler.disable()  # pytest's: no dump of a stack on stderr for a SIGBUS sent on purpose
                os.kill(os.getpid(), value)
            os._exit(value)

    def fill(self, ids, out, epoch=None):
        self._maybe_die(ids)
        return super().fill(ids, out, epoch)

    def documents(self, ids, epoch=None):
        self._maybe_die(ids)
        return super().documents(ids, epoch)


def _dataset(ds_path, seq_len=SEQ, **how):
    ds = DyingDataset(ds_path, seq_len=seq_len, shuffle=False)
    ds.main_pid = os.getpid()
    for k, v in how.items():
        setattr(ds, k, v)
    return ds


def _reference(ds_path, start, n, seq_len=SEQ):
    ds = StreamingDataset(ds_path, seq_len=seq_len, shuffle=False)
    batches = list(StreamingDataLoader(ds, batch_size=4))
    return [b["input_ids"].clone() for b in batches[start:start + n]]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_killed_before_its_first_job_is_worker_died(ds_path, monkeypatch, sig):
    """The worker is dead (and reaped) before the main process sends it its first job: the send must not
    surface as a raw BrokenPipeError."""
    made = WorkerPool.__init__

    def made_then_killed(self, *args, **kwargs):
        made(self, *args, **kwargs)
        victim = self.procs[1]
        os.kill(victim.pid, sig)
        victim.join(timeout=60)
        assert not victim.is_alive()

    monkeypatch.setattr(WorkerPool, "__init__", made_then_killed)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, shuffle=False), batch_size=4, num_workers=2)
    catchable = sig != signal.SIGKILL
    previous = signal.signal(sig, signal.SIG_DFL) if catchable else None  # the workers inherit the default
    try:
        with pytest.raises(WorkerDied, match=rf"loader worker 1 \(pid \d+\) died before its job started: "
                                             rf"killed by {sig.name}"):
            next(iter(loader))
    finally:
        if catchable:
            signal.signal(sig, previous)  # whatever an earlier test left behind
    monkeypatch.setattr(WorkerPool, "__init__", made)
    got = [b["input_ids"].clone() for b in loader]  # afresh, from the start: nothing was served
    assert all(torch.equal(a, b) for a, b in zip(got, _reference(ds_path, 0, len(got))))


@pytest.mark.parametrize("how,said", [(("signal", signal.SIGKILL), "killed by SIGKILL; .*out-of-memory killer"),
                                      (("signal", signal.SIGBUS), "killed by SIGBUS; .*--shm-size"),
                                      (("exit", 3), "exited with code 3")])
def test_a_worker_that_dies_while_filling_a_batch_is_named_with_how_it_died(ds_path, how, said):
    ds = _dataset(ds_path, die_at=4 * 5, how=how)  # batch 5 (worker 1 of 2) holds sample 20
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    served = 0
    with pytest.raises(WorkerDied, match=rf"loader worker 1 \(pid \d+\) died while producing batch 5: {said}"):
        for _ in loader:
            served += 1
    assert served == 5  # batches 0-4 came through; batch 5 is the dead worker's
    ds.die_at = None
    got = [b["input_ids"].clone() for b, _ in zip(loader, range(3))]
    assert all(torch.equal(a, b) for a, b in zip(got, _reference(ds_path, 5, 3)))  # the same position


def test_a_persistent_worker_that_dies_between_epochs_is_reported_then_replaced(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ, shuffle=False)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    first = [b["input_ids"].clone() for b in loader]
    victim = loader._pool.procs[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    with pytest.raises(WorkerDied, match=r"loader worker 0 \(pid \d+\) died between jobs: killed by SIGKILL"):
        next(iter(loader))
    second = [b["input_ids"].clone() for b in loader]  # new workers, epoch 1 from its start
    assert len(second) == len(first)
    loader.close()


def test_a_dead_worker_in_whole_document_mode_is_worker_died(ds_path):
    """Without seq_len the batches come through torch's DataLoader workers: their death is WorkerDied too."""
    ds = _dataset(ds_path, seq_len=None, die_at=4 * 3, how=("signal", signal.SIGKILL))
    with pytest.raises(WorkerDied, match=r"loader worker 1 \(pid \d+\) died while producing whole-document "
                                         r"batches: killed by SIGKILL"):
        for _ in StreamingDataLoader(ds, batch_size=4, num_workers=2):
            pass
