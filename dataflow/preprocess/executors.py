"""Where units run: in this process, on a local process pool, or on a Ray cluster.

Every executor yields unit outputs strictly in unit order, with at most `window` units in flight, so
the commit side is the same for all of them and memory stays bounded. A compressed JSONL unit is read
here and handed out as pieces of its decompressed stream (`pieces.py`), one output per piece. Scale-out beyond one machine
uses an existing engine (Ray, or task slices run by Slurm/Kubernetes), never a home-made cluster.
"""

from __future__ import annotations

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
        for u in _read_ahead(units):
            stats = UnitStats(u.index, 0, 0)
            yield UnitOutput(_without_data(u), stats, tokenize_unit_batches(u, spec, stats), lambda: None)
    else:
        with pool or start_local_pool(workers, spec.tokenizer, spec.engine) as running:
            yield from _run_pool(units, spec, workers, scratch, running)


def _read_ahead(units: Iterator[Unit]) -> Iterator[Unit]:
    """`units`, the next one read on a thread while this one is tokenized: a compressed file's next piece
    decompresses (zstd and zlib release the GIL) while the current one is encoded."""
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read() -> None:
        try:
            for u in units:
                while not stop.is_set():
                    try:
                        ahead.put(u, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            ahead.put(None)
        except BaseException as e:  # a damaged compressed stream: raised where the units are taken
            ahead.put(e)

    reader = threading.Thread(target=read, name="dataflow-read-ahead", daemon=True)
    reader.start()
    try:
        while (item := ahead.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join(timeout=5)


def _run_pool(units: Iterable[Unit], spec: UnitSpec, workers: int, scratch: str,
              pool: ProcessPoolExecutor) -> Iterator[UnitOutput]:
    """Outputs in unit order. A feeder thread reads the next units (decompressing a compressed file's
    pieces) and submits them while this thread commits, so workers are not kept waiting by the commit;
    at most `2 * workers + 2` units are in flight."""
    window = 2 * workers + 2
    pending: queue.Queue = queue.Queue(maxsize=window - 1)  # (future, path, unit), or an exception, or None
    stop = threading.Event()

    def feed() -> None:
        try:
            for u in units:
                path = _scratch_path(scratch, u)
                item = (pool.submit(tokenize_unit_to_file, u, spec, path), path, _without_data(u))
                while not stop.is_set():
                    try:
                        pending.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    item[0].cancel()
                    return
            pending.put(None)
        except BaseException as e:  # a damaged compressed stream: raised where the outputs are read
            pending.put(e)

    feeder = threading.Thread(target=feed, name="dataflow-feeder", daemon=True)
    feeder.start()
    try:
        while (item := pending.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            future, path, unit = item
            yield _file_output(unit, future.result(), path)
    finally:
        stop.set()
        while True:  # cancel what was submitted but not committed
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple):
                item[0].cancel()
        feeder.join(timeout=5)


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
