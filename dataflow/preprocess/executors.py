"""Where units run: in this process, on a local process pool, or on a Ray cluster.

Every executor yields unit outputs strictly in unit order, with at most `window` units in flight, so
the commit side is the same for all of them and memory stays bounded. A compressed JSONL unit is read
here and handed out as pieces of its decompressed stream (`pieces.py`), one output per piece. Scale-out beyond one machine
uses an existing engine (Ray, or task slices run by Slurm/Kubernetes), never a home-made cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue
import sys
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.lifetime import die_with_parent
from dataflow.preprocess.pieces import expand
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.worker import (UnitSpec, UnitStats, tokenize_unit_batches, tokenize_unit_in_memory,
                                        tokenize_unit_to_file, worker_tokenizer)


@dataclass
class UnitOutput:
    unit: Unit  # the unit or piece tokenized (without its data)
    stats: UnitStats
    batches: Iterable[pa.RecordBatch]
    cleanup: Callable[[], None]


def _read_stream(path: str) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(path, "r") as source:
        yield from pa.ipc.open_stream(source)


def _file_output(unit: Unit, stats: UnitStats, path: str) -> UnitOutput:
    return UnitOutput(_without_data(unit), stats, _read_stream(path), lambda: os.path.exists(path) and os.remove(path))


def _without_data(unit: Unit) -> Unit:
    return dataclasses.replace(unit, data=None) if unit.data is not None else unit


def _scratch_path(scratch: str, unit: Unit) -> str:
    return os.path.join(scratch, f"unit-{unit.index:08d}" + (f"-{unit.piece:08d}" if unit.piece >= 0 else "")
                        + ".arrows")


def _warm(tokenizer: str, engine: str) -> None:
    die_with_parent()
    worker_tokenizer(tokenizer, engine)


def _started() -> None:
    """A no-op task: submitting one per worker makes the pool start them all now."""


def start_local_pool(workers: int, tokenizer: str, engine: str) -> ProcessPoolExecutor:
    """Worker processes, started at once, each with the tokenizer of `worker_tokenizer(tokenizer, engine)`:
    inherited when forked from a process that adopted it, else loaded (and proven) in the worker."""
    # fork where it is safe (Linux): workers start with the tokenizer this process loaded and proved
    context = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_warm, initargs=(tokenizer, engine))
    for _ in range(workers):
        pool.submit(_started)
    return pool


def run_units(units: list[Unit], spec: UnitSpec, workers: int, executor: str, scratch: str,
              pool: ProcessPoolExecutor | None = None, *, piece_bytes: int = 32 << 20,
              first_piece: int = 0) -> Iterator[UnitOutput]:
    """Tokenize `units` and yield their outputs in unit order (on `pool` when one is given).

    Compressed JSONL units are cut into pieces of about `piece_bytes`; the first unit resumes at
    `first_piece`."""
    os.makedirs(scratch, exist_ok=True)
    units = expand(units, piece_bytes, first_piece)
    if executor == "ray":
        yield from _run_ray(units, spec, workers)
    elif executor != "local":
        raise ConfigError(f"unknown executor {executor!r}; choose local or ray")
    elif workers <= 1:  # in this process, streamed: each batch is committed as soon as it is tokenized
        with contextlib.closing(_read_ahead(units)) as ahead:
            for u in ahead:
                stats = UnitStats(u.index, 0, 0)
                yield UnitOutput(_without_data(u), stats, tokenize_unit_batches(u, spec, stats), lambda: None)
    else:
        with pool or start_local_pool(workers, spec.tokenizer, spec.engine) as running:
            yield from _run_pool(units, spec, workers, scratch, running)


def _threaded(items: Iterable, depth: int, name: str, drop: Callable[[object], None] = lambda item: None) -> Iterator:
    """`items`, produced on a thread at most `depth` ahead of the caller; an exception there (a damaged
    compressed stream) is raised here. A caller that stops early stops the thread, and `drop` gets each item
    produced but never taken."""
    ahead: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    drop(item)
                    return
            put(_END)
        except BaseException as e:
            put(e)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while (item := ahead.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while True:
            try:
                item = ahead.get_nowait()
            except queue.Empty:
                break
            if item is not _END and not isinstance(item, BaseException):
                drop(item)
        thread.join(timeout=5)


_END = object()


def _read_ahead(units: Iterable[Unit]) -> Iterator[Unit]:
    """`units`, the next one read on a thread while this one is tokenized: a compressed file's next piece
    decompresses while the current one is encoded (both outside the GIL)."""
    return _threaded(units, 1, "dataflow-read-ahead")


def _run_pool(units: Iterable[Unit], spec: UnitSpec, workers: int, scratch: str,
              pool: ProcessPoolExecutor) -> Iterator[UnitOutput]:
    """Outputs in unit order. A feeder thread reads the next units (decompressing a compressed file's
    pieces) and submits them while this thread commits, so workers are not kept waiting by the commit;
    at most `2 * workers + 2` units are in flight."""
    def submitted() -> Iterator[tuple]:
        for u in units:
            path = _scratch_path(scratch, u)
            yield pool.submit(tokenize_unit_to_file, u, spec, path), path, _without_data(u)

    with contextlib.closing(_threaded(submitted(), 2 * workers + 1, "dataflow-feeder",
                                      drop=lambda item: item[0].cancel())) as outputs:
        for future, path, unit in outputs:
            yield _file_output(unit, future.result(), path)


def _run_ray(units: Iterable[Unit], spec: UnitSpec, workers: int) -> Iterator[UnitOutput]:
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
        pending.append((remote.remote(u, spec), _without_data(u)))
        if len(pending) >= window:
            break
    while pending:
        ref, unit = pending.popleft()
        stats, batches = ray.get(ref)
        nxt = next(todo, None)
        if nxt is not None:
            pending.append((remote.remote(nxt, spec), _without_data(nxt)))
        yield UnitOutput(unit, stats, batches, lambda: None)
