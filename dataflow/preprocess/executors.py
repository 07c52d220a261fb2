"""Where bundles run: executors that own their workers (in this process, a local process pool, Ray).

Every executor has one lifecycle: `start()` starts its workers (each loads the tokenizer, or inherits the
one this process adopted), `submit()` hands it the bundles and returns at once (the workers begin while the
caller checks its input), `results()` yields what `worker.tokenize_bundle` made of them (finished shards in
the scratch folder) strictly in input order with a bounded number of bundles in flight, and `stop(now)` ends it:
`now` (an error or Ctrl-C) kills the workers at once instead of waiting for the bundles they hold (whose
shards no journal lists: a rerun makes them again). As a context manager an executor is stopped on exit,
at once if the block raised, so nothing is left running whichever way a run ends; it starts at `start()`
or at the first `submit()`, so that the caller can first load what forked workers should inherit.

What comes back per bundle is a few hundred bytes of manifest entries and counts, never tokens, so the
commit side is the same for every executor and memory stays bounded. Scale-out beyond one machine uses an
existing engine (Ray, or task slices run by Slurm/Kubernetes), never a home-made cluster.
"""

from __future__ import annotations

import abc
import multiprocessing
import os
import signal
import sys
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from dataflow.errors import ConfigError
from dataflow.lifetime import die_with_parent
from dataflow.threads import Ahead
from dataflow.sources.records import Unit
from dataflow.preprocess.worker import BundleResult, UnitSpec, tokenize_bundle, worker_tokenizer


class Executor(abc.ABC):
    """Runs bundles on `workers` workers that tokenize with (`tokenizer`, `engine`); see the module."""

    local = True  # its workers read this machine's files (the spill files of a compressed input's pieces)

    def __init__(self, workers: int, tokenizer: str, engine: str) -> None:
        self.workers, self.tokenizer, self.engine = workers, tokenizer, engine

    def start(self) -> None:
        """Start the workers now (their tokenizer loads while the caller does other work)."""

    @abc.abstractmethod
    def submit(self, bundles: Iterable[list[Unit]], spec: UnitSpec, scratch: str) -> None:
        """Begin tokenizing `bundles` (read lazily) into shards in `scratch`; returns at once."""

    @abc.abstractmethod
    def results(self) -> Iterator[BundleResult]:
        """The results of the submitted bundles, in input order."""

    def stop(self, now: bool = False) -> None:
        """End the workers; `now`: kill them instead of letting the bundles in flight finish."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(now=exc_type is not None)


class InProcessExecutor(Executor):
    """Bundles one after another in the calling thread: no process to start or stop, for tests and for code
    that embeds a tokenize. The CLI does not use it, even for --workers 1: an engine call of several seconds
    would delay a Ctrl-C, and the pool's one worker overlaps tokenizing with reading the next bundle."""

    def submit(self, bundles: Iterable[list[Unit]], spec: UnitSpec, scratch: str) -> None:
        os.makedirs(scratch, exist_ok=True)
        self._work = (bundles, spec, scratch)

    def results(self) -> Iterator[BundleResult]:
        bundles, spec, scratch = self._work
        for bundle in bundles:
            yield from tokenize_bundle(bundle, spec, scratch)


def _warm(tokenizer: str, engine: str) -> None:
    """A pool worker's start: it dies with its parent, leaves Ctrl-C to the coordinator, loads the tokenizer."""
    die_with_parent()
    # Ctrl-C reaches the whole process group: the coordinator alone handles it (and stops the workers at once)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker_tokenizer(tokenizer, engine)
    except Exception:  # noqa: BLE001  (the coordinator's own load says what is wrong, in one line; a bundle
        pass           # run here loads it again, and its future carries the error)


def _started() -> None:
    """A no-op task: submitting one per worker makes the pool start them all now."""


class LocalPoolExecutor(Executor):
    """A pool of worker processes on this machine (one for --workers 1). Each worker loads its tokenizer
    when it starts; forked (on Linux), it inherits the one this process adopted before `start()` instead:
    no worker imports, loads or proves anything then."""

    def __init__(self, workers: int, tokenizer: str, engine: str) -> None:
        super().__init__(workers, tokenizer, engine)
        self._pool: ProcessPoolExecutor | None = None
        self._futures: Ahead | None = None  # the feeder of the submitted bundles

    def start(self) -> None:
        if self._pool is not None:
            return
        context = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
        self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_warm,
                                         initargs=(self.tokenizer, self.engine))
        for _ in range(self.workers):
            self._pool.submit(_started)

    def submit(self, bundles: Iterable[list[Unit]], spec: UnitSpec, scratch: str) -> None:
        """A feeder thread takes the next bundles (a compressed file's pieces come from its cut process, see
        readers/cut_process.py) and submits them while the caller checks or commits; at most `2 * workers + 2`
        bundles are in flight."""
        self.start()
        os.makedirs(scratch, exist_ok=True)
        pool = self._pool
        submitted = (pool.submit(tokenize_bundle, bundle, spec, scratch) for bundle in bundles)
        self._futures = Ahead(submitted, 2 * self.workers + 1, "dataflow-feeder")

    def results(self) -> Iterator[BundleResult]:
        for future in self._futures:
            yield from future.result()

    def stop(self, now: bool = False) -> None:
        """`now`: kill the workers first (the feeder's next submit then fails and it ends), else let them
        finish; then stop the feeder and shut the pool down."""
        pool, self._pool = self._pool, None
        futures, self._futures = self._futures, None
        if pool is not None and now:
            # the executor's own map of its worker processes: it offers no public way to stop them mid-task.
            # No future is cancelled: the pool fails them all as broken (Python 3.11 crashes its manager
            # thread on a cancelled one, and the exit then hangs)
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.kill()
        if futures is not None:
            futures.close(join_s=0.5 if now else 5)  # a daemon thread: at an interrupt, never wait for a read
        if pool is None:
            return
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=not now)
        if now and manager is not None:
            # let the manager thread see the dead workers and close its pipes now: left running, Python
            # 3.11's exit handler wakes it through a pipe it may have closed meanwhile (a traceback after the
            # one-line error)
            manager.join(timeout=10)


class RayExecutor(Executor):
    """Ray tasks (on the cluster of RAY_ADDRESS, or a local one) write their shards to the scratch folder
    (one every node sees) and return only their results. `stop(now=True)` cancels the tasks in flight."""

    local = False  # tasks may run on other machines: a compressed input's pieces travel with their bytes

    def __init__(self, workers: int, tokenizer: str, engine: str) -> None:
        super().__init__(workers, tokenizer, engine)
        self._pending: deque = deque()  # the refs of the tasks in flight, in input order
        self._todo: Iterator[list[Unit]] = iter(())
        self._launch: Callable[[list[Unit]], Any] = lambda bundle: None

    def start(self) -> None:
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)

    def submit(self, bundles: Iterable[list[Unit]], spec: UnitSpec, scratch: str) -> None:
        """Launch the first tasks: as many as the cluster has CPUs (or `workers`), plus two."""
        ray = _import_ray()
        self.start()
        os.makedirs(scratch, exist_ok=True)
        remote = ray.remote(num_cpus=1)(tokenize_bundle)
        self._launch = lambda bundle: remote.remote(bundle, spec, scratch)
        self._todo = iter(bundles)
        in_flight_limit = max(self.workers, int(ray.available_resources().get("CPU", 1))) + 2
        for bundle in self._todo:
            self._pending.append(self._launch(bundle))
            if len(self._pending) >= in_flight_limit:
                break

    def results(self) -> Iterator[BundleResult]:
        """One result at a time; each taken launches the next task."""
        ray = _import_ray()
        while self._pending:
            result = ray.get(self._pending[0])
            self._pending.popleft()
            nxt = next(self._todo, None)
            if nxt is not None:
                self._pending.append(self._launch(nxt))
            yield from result

    def stop(self, now: bool = False) -> None:
        pending, self._pending = self._pending, deque()
        if pending:  # an interrupt or an error: the tasks still running are of no use
            ray = _import_ray()
            for ref in pending:
                ray.cancel(ref, force=True)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'dataflow-lm[ray]'") from None
    return ray


EXECUTORS: dict[str, type[Executor]] = {"local": LocalPoolExecutor, "ray": RayExecutor,
                                        "inprocess": InProcessExecutor}


def check_executor(name: str) -> None:
    """Refuse an executor name that is not one of `EXECUTORS`."""
    if name not in EXECUTORS:
        raise ConfigError(f"--executor {name!r}: unknown; choose local or ray (or inprocess from Python)")


def make_executor(name: str, workers: int, tokenizer: str, engine: str) -> Executor:
    """The executor called `name` (not started)."""
    check_executor(name)
    return EXECUTORS[name](workers, tokenizer, engine)

