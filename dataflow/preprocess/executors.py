"""Where bundles run: on a local process pool (one process for --workers 1), or on a Ray cluster.

Every executor yields bundle results strictly in input order, with a bounded number of bundles in flight,
so the commit side is the same for all of them and memory stays bounded. Each bundle is tokenized by
`worker.tokenize_bundle` into finished shards in the scratch folder; what comes back is a few hundred bytes
of manifest entries and counts, never tokens (a Ray task returns the same). A compressed JSONL file is read
here and handed out as pieces of its decompressed stream (`pieces.py`), one bundle per piece. Bundles never
run in the coordinator's own thread: a Ctrl-C there is handled at once (the workers are killed), never
after an engine call of many seconds returns. Scale-out
beyond one machine uses an existing engine (Ray, or task slices run by Slurm/Kubernetes), never a
home-made cluster.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator

from dataflow.errors import ConfigError
from dataflow.lifetime import die_with_parent
from dataflow.preprocess.readers import expand
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.worker import BundleResult, UnitSpec, tokenize_bundle, worker_tokenizer


def _warm(tokenizer: str, engine: str) -> None:
    die_with_parent()
    # Ctrl-C reaches the whole process group: the coordinator alone handles it (and stops the workers at once)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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


def stop_local_pool(pool: ProcessPoolExecutor, now: bool) -> None:
    """Shut the pool down; `now` (an interrupt or an error): kill its workers first instead of waiting for the
    bundles they are tokenizing (whose shards, in the scratch folder, no journal lists: a rerun redoes them)."""
    if now:
        # the executor's own map of its worker processes: it offers no public way to stop them mid-task. No
        # future is cancelled: the pool fails them all as broken (Python 3.11 crashes its manager thread on a
        # cancelled one, and the exit then hangs)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=not now)
    if now and manager is not None:
        # let the manager thread see the dead workers and close its pipes now: left running, Python 3.11's exit
        # handler wakes it through a pipe it may have closed meanwhile (a traceback after the one-line error)
        manager.join(timeout=10)


def run_bundles(bundles: list[list[Unit]], spec: UnitSpec, workers: int, executor: str, scratch: str,
                pool: ProcessPoolExecutor | None = None, *, piece_bytes: int = 32 << 20,
                first_piece: int = 0) -> Iterator[BundleResult]:
    """Tokenize `bundles` into shards in `scratch` and yield their results in order (on `pool` when one is
    given). Compressed JSONL files are cut into pieces of about `piece_bytes`; the first bundle resumes at
    `first_piece`."""
    os.makedirs(scratch, exist_ok=True)
    work = expand(bundles, piece_bytes, first_piece)
    if executor == "ray":
        yield from _run_ray(work, spec, workers, scratch)
    elif executor != "local":
        raise ConfigError(f"unknown executor {executor!r}; choose local or ray")
    elif pool is not None:
        yield from _run_pool(work, spec, workers, scratch, pool)
    else:
        running = start_local_pool(workers, spec.tokenizer, spec.engine)
        try:
            yield from _run_pool(work, spec, workers, scratch, running)
        except BaseException:
            stop_local_pool(running, now=True)
            raise
        stop_local_pool(running, now=False)


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


def _run_pool(bundles: Iterable[list[Unit]], spec: UnitSpec, workers: int, scratch: str,
              pool: ProcessPoolExecutor) -> Iterator[BundleResult]:
    """Results in order. A feeder thread reads the next bundles (decompressing a compressed file's pieces)
    and submits them while this thread commits; at most `2 * workers + 2` bundles are in flight. A caller
    that stops early stops the pool (`stop_local_pool`), which fails the bundles still queued."""
    submitted = (pool.submit(tokenize_bundle, bundle, spec, scratch) for bundle in bundles)
    with contextlib.closing(_threaded(submitted, 2 * workers + 1, "dataflow-feeder")) as futures:
        for future in futures:
            yield future.result()


def _run_ray(bundles: Iterable[list[Unit]], spec: UnitSpec, workers: int, scratch: str) -> Iterator[BundleResult]:
    """Ray tasks write their shards to `scratch` (a folder every node sees) and return only their results."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'dataflow-lm[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    remote = ray.remote(num_cpus=1)(tokenize_bundle)
    window = max(workers, int(ray.available_resources().get("CPU", 1))) + 2
    pending: deque = deque()
    todo = iter(bundles)
    for bundle in todo:
        pending.append(remote.remote(bundle, spec, scratch))
        if len(pending) >= window:
            break
    try:
        while pending:
            result = ray.get(pending[0])
            pending.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(remote.remote(nxt, spec, scratch))
            yield result
    finally:
        for ref in pending:  # an interrupt or an error: the tasks still running are of no use
            ray.cancel(ref, force=True)
