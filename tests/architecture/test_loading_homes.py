"""Each loading rule has one home that its users call (issue 35, step 7): the saved position beside its owner,
the cursor; the worker ring's sizing rule in the ring, which the profiler's memory estimate uses instead of
deriving it again; what a prefetcher holds, said by the prefetcher; the loader's one "layout", a batch's."""

import ast
import pathlib

import pytest

from support.data import write_counting_dataset
from dataflow import DevicePrefetcher, StreamingDataLoader, StreamingDataset
from dataflow.loading import contract, cursor, plan
from dataflow.profiling.session import RunSettings, held_batches, memory_estimate_mb

SEQ = 16


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("homes"), 20_000, 60, "8KB")


def test_the_saved_position_lives_beside_its_owner_the_cursor(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ)
    loader = StreamingDataLoader(ds, batch_size=2)
    next(iter(loader))
    state = ds.cursor.state()
    assert type(state) is cursor.LoaderState and cursor.LoaderState.__module__ == "dataflow.loading.cursor"
    assert not hasattr(plan, "LoaderState") and not hasattr(plan, "STATE_VERSION")
    saved = loader.state_dict()
    assert saved["version"] == cursor.STATE_VERSION == 2 and cursor.LoaderState.from_dict(saved) == state
    assert state.consumed == 2


@pytest.mark.parametrize("workers,prefetch_factor,depth", [(1, 2, 2), (2, 1, 5), (3, 4, 1)])
def test_the_profilers_ring_estimate_is_the_ring_a_loader_makes(ds_path, workers, prefetch_factor, depth):
    """The profiler's estimate of the worker ring (no shards, no CUDA: the ring alone) is the bytes of the ring
    a loader behind a prefetcher of that depth allocates."""
    ds = StreamingDataset(ds_path, seq_len=SEQ)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, prefetch_factor=prefetch_factor)
    prefetcher = DevicePrefetcher(loader, device="cpu", depth=depth)
    assert loader.held_batches == held_batches(depth)
    try:
        next(iter(prefetcher))
        ring = loader._pool.ring
        s = RunSettings(data=ds_path, batch_size=4, seq_len=SEQ, num_workers=workers, depth=depth,
                        prefetch_factor=prefetch_factor)
        assert memory_estimate_mb(s, 0, 1, 1, cuda=False) * 1e6 == pytest.approx(ring.slots * ring.slot_bytes)
        assert ring.slots == loader._pool.per_worker * workers
    finally:
        prefetcher.close()
        loader.close()



def test_the_loaders_layout_is_the_batch_layout_and_no_other(ds_path):
    """Each layout has its own name (tokenize's `OutputLayout`, the trainer's `ParallelLayout`, the loader's
    batch): the loader's is `BatchLayout`, what `batch_layout()` returns, and no loading module defines a bare
    `Layout`."""
    layout = StreamingDataset(ds_path, seq_len=SEQ).batch_layout(4)
    assert {k: shape for k, (shape, _) in layout.items()} == {"input_ids": (4, SEQ), "labels": (4, SEQ)}
    assert hasattr(contract, "BatchLayout")
    root = pathlib.Path(contract.__file__).parent
    bare = [p.name for p in sorted(root.glob("*.py")) if "Layout" in _defined(ast.parse(p.read_text()))]
    assert not bare, f"loading modules defining a bare Layout: {bare}"


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level (classes, functions, assignments)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
