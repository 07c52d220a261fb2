"""A /dev/shm too small for the loader's batch ring (Docker's default is 64 MB) is one line saying what
took the space (batch x seq_len x fields x slots x workers) and what to change, never a raw torch error.

The test decides how much shared memory there is (it replaces the free-space probe), or makes torch's
allocation fail the way it does when /dev/shm is full.
"""

import pytest
import torch

from support.data import write_counting_dataset
from dataflow import ConfigError, StreamingDataLoader, StreamingDataset
from dataflow.loading import ring

SEQ = 16


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("shm"), 20_000, 60, "8KB")


def _loader(ds_path, **kwargs):
    return StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, position_ids=True), **kwargs)


@pytest.mark.parametrize("workers,held,per_worker", [(2, 4, 5), (3, 0, 3), (1, 7, 10)])
def test_too_little_shared_memory_names_what_took_it_and_the_fixes(ds_path, monkeypatch, workers, held, per_worker):
    # 64 KB of /dev/shm; the ring needs 3 fields x 4 KB a slot
    monkeypatch.setattr(ring, "shm_free", lambda: 64 * 1024, raising=False)
    loader = _loader(ds_path, batch_size=4, num_workers=workers, held_batches=held)
    with pytest.raises(ConfigError) as err:
        next(iter(loader))
    msg = str(err.value)
    assert "\n" not in msg
    need = 3 * 4096 * per_worker * workers  # three int64 [4, 16] fields, each rounded up to a page
    assert f"needs {need / 2**20:.1f} MB of shared memory (/dev/shm) and 0.1 MB is free" in msg
    assert "batch_size x seq_len 4 x 16 x 3 fields (input_ids, labels, position_ids) x 8 bytes" in msg
    assert f"x {per_worker} batches per worker" in msg and f"x {workers} workers" in msg
    for fix in ("Lower num_workers", "held_batches", "smaller batch_size", "--shm-size=1g"):
        assert fix in msg


def test_a_failed_shared_allocation_is_the_same_one_line_error(ds_path, monkeypatch):
    """/dev/shm looked big enough, but torch could not allocate (another process took the space meanwhile)."""
    monkeypatch.setattr(ring, "shm_free", lambda: 10 * 2**20, raising=False)

    def full(self):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2>: No space left on device (28)")

    loader = _loader(ds_path, batch_size=4, num_workers=2)
    monkeypatch.setattr(torch.Tensor, "share_memory_", full)
    with pytest.raises(ConfigError, match=r"needs 0\.\d MB of shared memory \(/dev/shm\) and 10\.0 MB is free "
                                          r"\(unable to allocate shared memory.*No space left on device.*--shm-size"):
        next(iter(loader))


def test_a_ring_that_fits_is_made_and_no_workers_need_none(ds_path, monkeypatch):
    # exactly the ring of 2 workers that may hold 4 batches
    monkeypatch.setattr(ring, "shm_free", lambda: 3 * 4096 * 5 * 2, raising=False)
    got = [b["input_ids"].clone() for b in _loader(ds_path, batch_size=4, num_workers=2)]
    monkeypatch.setattr(ring, "shm_free", lambda: 0, raising=False)
    want = [b["input_ids"] for b in _loader(ds_path, batch_size=4, num_workers=0)]  # in process: no ring
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
