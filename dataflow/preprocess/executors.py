"""Where units run: in this process, on a local process pool, or on a Ray cluster.

Every executor yields unit outputs strictly in unit order, with at most `window` units in flight, so
the commit side is the same for all of them and memory stays bounded. Scale-out beyond one machine
uses an existing engine (Ray, or task slices run by Slurm/Kubernetes), never a home-made cluster.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.lifetime import die_with_parent
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.worker import (UnitSpec, UnitStats, tokenize_unit_in_memory, tokenize_unit_to_file,
                                        worker_tokenizer)


@dataclass
class UnitOutput:
    stats: UnitStats
    batches: Iterable[pa.RecordBatch]
    cleanup: Callable[[], None]


def _read_stream(path: str) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(path, "r") as source:
        yield from pa.ipc.open_stream(source)


def _file_output(stats: UnitStats, path: str) -> UnitOutput:
    return UnitOutput(stats, _read_stream(path), lambda: os.path.exists(path) and os.remove(path))


def _warm(tokenizer: str, engine: str) -> None:
    die_with_parent()
    worker_tokenizer(tokenizer, engine)


def _started() -> None:
    """A no-op task: submitting one per worker makes the pool start them all now."""


def start_local_pool(workers: int, tokenizer: str, engine: str) -> ProcessPoolExecutor:
    """Worker processes that begin loading the tokenizer at once, while the main process prepares.

    Their engine decision binds nothing: each unit's spec names the engine the main process chose,
    and a worker loads that one if it differs.
    """
    pool = ProcessPoolExecutor(workers, initializer=_warm, initargs=(tokenizer, engine))
    for _ in range(workers):
        pool.submit(_started)
    return pool


def run_units(units: list[Unit], spec: UnitSpec, workers: int, executor: str, scratch: str,
              pool: ProcessPoolExecutor | None = None) -> Iterator[UnitOutput]:
    """Tokenize `units` and yield their outputs in unit order (on `pool` when one is given)."""
    os.makedirs(scratch, exist_ok=True)
    if executor == "ray":
        yield from _run_ray(units, spec, workers)
    elif executor != "local":
        raise ConfigError(f"unknown executor {executor!r}; choose local or ray")
    elif workers <= 1:
        for u in units:
            path = os.path.join(scratch, f"unit-{u.index:08d}.arrows")
            yield _file_output(tokenize_unit_to_file(u, spec, path), path)
    else:
        with pool or start_local_pool(workers, spec.tokenizer, spec.engine) as running:
            yield from _run_pool(units, spec, workers, scratch, running)


def _run_pool(units: list[Unit], spec: UnitSpec, workers: int, scratch: str,
              pool: ProcessPoolExecutor) -> Iterator[UnitOutput]:
    pending: deque = deque()
    todo = iter(units)

    def submit() -> bool:
        u = next(todo, None)
        if u is None:
            return False
        path = os.path.join(scratch, f"unit-{u.index:08d}.arrows")
        pending.append((pool.submit(tokenize_unit_to_file, u, spec, path), path))
        return True

    while len(pending) < workers + 2 and submit():
        pass
    try:
        while pending:
            future, path = pending.popleft()
            stats = future.result()
            submit()
            yield _file_output(stats, path)
    finally:
        for future, _ in pending:
            future.cancel()


def _run_ray(units: list[Unit], spec: UnitSpec, workers: int) -> Iterator[UnitOutput]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'dataflow-lm[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    remote = ray.remote(num_cpus=1)(tokenize_unit_in_memory)
    window = max(workers, int(ray.available_resources().get("CPU", 1))) + 2
    pending: deque = deque()
    todo = iter(units)
    for u in todo:
        pending.append(remote.remote(u, spec))
        if len(pending) >= window:
            break
    while pending:
        stats, batches = ray.get(pending.popleft())
        nxt = next(todo, None)
        if nxt is not None:
            pending.append(remote.remote(nxt, spec))
        yield UnitOutput(stats, batches, lambda: None)
