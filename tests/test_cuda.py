"""CUDA-only checks of the hand-off and the prefetcher: pinned ring, direct and staged copies, no race.

Skipped (cleanly, with the reason) on machines without a CUDA device; `tools/gpu_check.py` measures
what these only assert.
"""

import pytest
import torch

from support.data import write_counting_dataset
from dataflow import DevicePrefetcher, StreamingDataLoader, StreamingDataset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SEQ = 64


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("cuda"), 200_000, 500, "64KB")


def reference(ds_path):
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8)
    return [b["input_ids"] for b in loader]


def _busy_gpu(ms_matrix: torch.Tensor) -> None:
    """Queue enough work on the current stream that a racing copy would land while it runs."""
    for _ in range(4):
        ms_matrix @ ms_matrix


def test_direct_copies_from_the_pinned_worker_ring_are_exact(ds_path):
    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8, num_workers=2,
                                 pin_memory=True)
    pf = DevicePrefetcher(loader, device="cuda", depth=2)
    busy = torch.randn(2048, 2048, device="cuda")
    got, pinned = [], []
    for batch in pf:
        assert batch["input_ids"].is_cuda
        pool = loader._pool  # None once the producer thread has finished the epoch
        if pool is not None:
            pinned.append(pool.ring.pinned)
        _busy_gpu(busy)  # the consumer's stream lags: slots must not be reused under its copies
        got.append(batch["input_ids"].cpu())
    assert pinned and all(pinned)  # the worker ring was page-locked with cudaHostRegister
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert pf.stats.direct_copies == pf.stats.batches == len(want)
    assert pf.stats.host_allocations == 0
    assert pf.stats.copy_s > 0


def test_staged_copies_reuse_depth_plus_one_pinned_buffers(ds_path):
    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8)
    pf = DevicePrefetcher(loader, device="cuda", depth=3)
    busy = torch.randn(2048, 2048, device="cuda")
    got = []
    for batch in pf:
        _busy_gpu(busy)
        got.append(batch["input_ids"].cpu())
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(got) == len(want)
    assert pf.stats.direct_copies == 0
    assert pf.stats.host_allocations == 3 + 1  # allocated once, then reused for every batch


def test_batches_survive_the_caching_allocator(ds_path):
    """Freed device batches are not handed out while the consumer's stream may still read them."""
    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8, num_workers=2,
                                 pin_memory=True)
    sums = []
    busy = torch.randn(2048, 2048, device="cuda")
    for batch in DevicePrefetcher(loader, device="cuda", depth=2):
        _busy_gpu(busy)
        sums.append(batch["input_ids"].sum())  # queued on the consumer's stream; the batch is then dropped
        del batch  # its block returns to the side stream's pool, where the next copies allocate
    assert [int(s) for s in sums] == [int(w.sum()) for w in want]


def test_plain_tensors_and_cpu_batches_of_other_loaders(ds_path):
    batches = [torch.arange(i, i + 1000) for i in range(20)]
    got = [b.cpu() for b in DevicePrefetcher(batches, device="cuda", depth=2)]
    assert all(torch.equal(a, b) for a, b in zip(got, batches))


def test_held_batches_become_pinned_copies_that_still_copy_directly(ds_path):
    """A consumer that keeps every batch gets owned copies once every slot is lent: page-locked like the ring,
    so the direct host-to-device path still applies; their values never change."""
    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8, num_workers=2,
                                 pin_memory=True)
    assert loader.pinned
    kept = list(loader)
    assert loader.stats.copies > 0
    assert all(b["input_ids"].is_pinned() for b in kept)
    pf = DevicePrefetcher(kept, device="cuda", depth=2, pinned=True)
    busy = torch.randn(2048, 2048, device="cuda")
    got = []
    for batch in pf:
        _busy_gpu(busy)
        got.append(batch["input_ids"].cpu())
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert pf.stats.direct_copies == len(want) and pf.stats.host_allocations == 0


def test_in_process_pinned_batches_copy_directly(ds_path):
    want = reference(ds_path)
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ, seed=3), batch_size=8, pin_memory=True)
    pf = DevicePrefetcher(loader, device="cuda", depth=3)
    got = [b["input_ids"].cpu() for b in pf]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert pf.stats.direct_copies == len(want)
