"""`AuditLog`: what one rank's loader served, appended to `DIR/audit-rank-R.jsonl` as it is yielded.

The loader (or a `StreamingDataset` iterated directly) calls `walk(plan, ...)` when it starts serving a
`BatchPlan` and `step()` for each batch it hands to the user (after the cursor moved, before the yield:
what a worker filled ahead is never recorded). Consecutive steps of a walk are kept as one run in memory
and written as one line, a strided range of global sample positions, so the hot path is a counter and a
clock read. Lines go out with one `os.write` on an O_APPEND file (two loaders of a rank may share it;
lines never interleave) at most `FLUSH_S` apart, when `state_dict()` is taken (a checkpoint's state is
then always on disk), at the end of a walk, at `close()` and at a normal exit. A kill loses at most the
unwritten run; a torn last line is closed off by the next writer and skipped by the reader.

Records (one JSON object a line, `kind` first): `session` (the layout and what the data is), `walk` (where
a plan starts and how the loader got there: `start`, `continue`, `load_state_dict`, `set_epoch`, `jump`),
`steps` (positions [start, stop, stride], the walk's steps [first, last], the fleet position `at` after
them, their state's fingerprint, and `tail`, where the epoch's drop-last tail begins, when the walk's last
batch is among them) and `end` (a clean stop). `dataflow audit DIR` replays them (`replay.py`).
Writing never raises into training: an unwritable folder is refused at construction, a later failed
write is said once as a warning (the records it held read as missing).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from typing import Any, Iterator, TypeVar

from dataflow.errors import ConfigError

T = TypeVar("T")
FORMAT = 1
FLUSH_S = 1.0  # the longest a served run stays in memory
_LIVE: "weakref.WeakSet[AuditLog]" = weakref.WeakSet()
log = logging.getLogger("dataflow.audit")


def state_fingerprint(state: dict[str, Any]) -> str:
    """A short name of a loader state (`state_dict()`): the audit names resumes by it."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def file_name(rank: int, worker: int | None = None) -> str:
    return f"audit-rank-{rank}.jsonl" if worker is None else f"audit-rank-{rank}-worker-{worker}.jsonl"


class AuditLog:
    """One rank's (or one torch DataLoader worker's) served positions, for `dataflow audit`.

    `state` is the loader's `LoaderState.to_dict()` at the start (its fixed fields name the data; the
    position fields are replaced per record); `layout` is (rank, world size, workers)."""

    def __init__(self, folder: str | os.PathLike, state: dict[str, Any], layout: tuple[int, int, int], *,
                 batch_size: int, drop_last: bool, source: str, worker: int | None = None):
        self.folder, self.worker = os.fspath(folder), worker
        self.template, self.layout = dict(state), [int(x) for x in layout]
        self.header = {"kind": "session", "version": FORMAT, "session": uuid.uuid4().hex[:12],
                       "host": socket.gethostname(), "pid": os.getpid(), "source": source,
                       "rank": self.layout[0], "world_size": self.layout[1], "workers": self.layout[2],
                       "worker": worker, "batch_size": int(batch_size), "drop_last": bool(drop_last),
                       "samples": state["num_samples"], "dataset": state["dataset"], "seed": state["seed"],
                       "seq_len": state["seq_len"]}
        self.path = os.path.join(self.folder, file_name(self.layout[0], worker))
        self._fd: int | None = None
        self._pid = os.getpid()
        self._lines: list[str] = []
        self._walks = 0
        self._walk: dict[str, Any] | None = None  # the walk being served
        self._run: list[Any] | None = None  # [walk, first step, last step] recorded, not yet written
        self._last = 0.0  # time.monotonic() of the last step recorded
        self._epoch_t = time.time() - time.monotonic()  # wall time = this + monotonic time
        self._flushed = time.monotonic()
        self._failed = False
        self._ended = False  # an `end` is the last record: nothing was served since
        self._position = (state["epoch"], state["consumed"])  # after the last step recorded
        self._loader_at = self._position  # where the loader's last walk stood (it may be ahead of the user)
        self._deferred: deque | None = None  # steps handed to a downstream, not yet yielded to the user
        self._lock = threading.Lock()  # a downstream's thread records while the loader's steps
        self._open()
        self._lines.append(self._json(dict(self.header, t=time.time())))
        _LIVE.add(self)

    def __reduce__(self) -> tuple:
        """A log never travels: a pickled copy (a worker's copy of the dataset) is None there, and a
        process that records makes its own."""
        return (_nothing, ())

    def mine(self, worker: int | None) -> bool:
        """Whether this log records for `worker` (None: the main process) of this very process."""
        return self.worker == worker and self._pid == os.getpid()

    # --- recording ----------------------------------------------------------------------------------
    def walk(self, plan: Any, via: str | None, first_step: int = 0, step_every: int = 1) -> int:
        """Start serving `plan` (a `BatchPlan`) and return the walk's number; its steps are the batches
        first_step, first_step + step_every, ... `via`: how the loader got to the plan's position (None: by
        serving, or by a jump it did not see, told apart by where the last walk stood)."""
        with self._lock:
            if self._walk is not None:
                self._loader_at = _walk_end(self._walk, self.worker)
            self._ended = False
            stayed = (plan.epoch, plan.consumed) == self._loader_at
            if via is None or via == "set_epoch" and stayed:  # set_epoch(e) where the loader stands moves nothing
                via = ("start" if self._walks == 0 else "continue") if stayed else "jump"
            self._walks += 1
            self._walk = {"plan": plan, "n": self._walks, "first": first_step, "every": step_every, "served": 0}
            if self._deferred is None or not self._deferred:
                self._end_run()
                self._position = (plan.epoch, plan.consumed)
            self._lines.append(self._json({"kind": "walk", "session": self.header["session"], "walk": self._walks,
                                           "t": time.time(), "epoch": plan.epoch, "consumed": plan.consumed,
                                           "via": via, "state": self._state(plan.epoch, plan.consumed),
                                           "layout": self.layout, "batches": plan.num_batches}))
            return self._walks

    def step(self) -> None:
        """The walk's next batch is being handed on: to the user (recorded now), or to a downstream that
        reads ahead after `defer()` (recorded when it calls `yielded()`)."""
        with self._lock:
            w = self._walk
            k = w["served"]
            w["served"] = k + 1
            run = self._run
            if self._deferred is not None:
                self._deferred.append((w, k))
            elif run is not None and run[0] is w and run[2] == k - 1:  # the hot path: the run goes on
                run[2] = k
                self._last = now = time.monotonic()
                if now - self._flushed >= FLUSH_S:
                    self._flush()
            else:
                self._record(w, k)

    @property
    def deferred(self) -> bool:
        """Whether steps are recorded when a downstream yields them (`defer`)."""
        return self._deferred is not None

    def defer(self) -> None:
        """From now on a step is recorded at `yielded()`, called as the downstream yields it to the user."""
        if self._deferred is None:
            self._deferred = deque()

    def yielded(self) -> None:
        """The oldest batch handed to the downstream reached the user."""
        with self._lock:
            if self._deferred:
                self._record(*self._deferred.popleft())

    def drop_pending(self) -> None:
        """Batches handed on but never yielded to the user (dropped read-ahead: a resume) are not served."""
        with self._lock:
            if self._deferred:
                self._deferred.clear()

    def _record(self, w: dict[str, Any], k: int) -> None:
        self._ended = False  # served after an `end`: the next close says where it stopped
        run = self._run
        if run is not None and run[0] is w and run[2] == k - 1:
            run[2] = k
        else:
            self._end_run()
            self._run = [w, k, k]
        self._last = now = time.monotonic()
        if now - self._flushed >= FLUSH_S:
            self._flush()

    def track(self, walk: int, items: Iterator[T]) -> Iterator[T]:
        """`items` of walk number `walk`, each recorded as a step as it is yielded; the walk ends with them."""
        try:
            for item in items:
                self.step()
                yield item
        finally:
            self.end_walk(walk)

    def end_walk(self, walk: int) -> None:
        """Walk number `walk` stopped (its epoch's end, a break, an error): its run is written now."""
        with self._lock:
            if self._walk is None or self._walk["n"] != walk:
                return
            self._loader_at = _walk_end(self._walk, self.worker)
            self._walk = None
            if not self._deferred:
                self._end_run()
                self._flush()

    def flush(self) -> None:
        """Write what is held (one append); never raises."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        """`flush` under the lock already held."""
        self._end_run()
        self._flushed = time.monotonic()
        if not self._lines or self._failed:
            return
        data, self._lines = "".join(self._lines).encode(), []
        try:
            if os.getpid() != self._pid:  # a forked copy: what it holds is the parent's to write
                return
            self._open()
            os.write(self._fd, data)
        except OSError as e:
            self._failed = True
            log.warning("audit: cannot append to %s (%s); this rank's later records are lost and `dataflow audit` "
                        "will report them missing", self.path, e)

    def close(self) -> None:
        """A clean stop: the held records and an `end` record (where the user stood) are written. Batches
        a downstream holds stay pending (the loader closes at each epoch's end while they are yielded)."""
        with self._lock:
            self._end_run()
            if self._walk is not None:
                self._loader_at = _walk_end(self._walk, self.worker)
            self._walk = None
            if self._ended:
                return
            self._ended = True
            epoch, consumed = self._position
            self._lines.append(self._json({"kind": "end", "session": self.header["session"], "t": time.time(),
                                           "epoch": epoch, "consumed": consumed, "state": self._state(epoch, consumed)}))
            self._flush()

    # --- inside -------------------------------------------------------------------------------------
    def _end_run(self) -> None:
        """Turn the held run of steps into a `steps` line."""
        if self._run is None:
            return
        w, k0, k1 = self._run
        self._run = None
        plan, every = w["plan"], w["every"]
        b0, b1 = w["first"] + k0 * every, w["first"] + k1 * every
        first, last = plan.sample_ids(b0), plan.sample_ids(b1)
        stride = plan.world * every if plan.batch_size == 1 else plan.world
        at = plan.consumed_after(b1 + 1)
        self._position = (plan.epoch, at)
        record = {"kind": "steps", "session": self.header["session"], "walk": w["n"], "epoch": plan.epoch,
                  "layout": self.layout, "pos": [int(first[0]), int(last[-1]) + 1, stride], "steps": [b0, b1],
                  "at": at, "state": self._state(plan.epoch, at), "t": self._epoch_t + self._last}
        if b1 + every >= plan.num_batches:  # the walk's last batch: the rest of the epoch is the drop-last tail
            record["tail"] = plan.consumed + plan.world * min(plan.num_batches * plan.batch_size,
                                                              plan.samples_per_rank)
            self._position = (plan.epoch + 1, 0) if self.worker is None else self._position
        self._lines.append(self._json(record))

    def _state(self, epoch: int, consumed: int) -> str:
        return state_fingerprint(dict(self.template, epoch=int(epoch), consumed=int(consumed)))

    @staticmethod
    def _json(record: dict[str, Any]) -> str:
        return json.dumps(record, separators=(",", ":")) + "\n"

    def _open(self) -> None:
        """Open the file for appends (once per process); a torn last line left by a kill is closed off."""
        if self._fd is not None and os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        try:
            os.makedirs(self.folder, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                os.write(self._fd, b"\n")
        except OSError as e:
            raise ConfigError(f"audit={self.folder}: cannot append to {self.path} ({e.strerror or e}); pass a "
                              f"writable folder") from None

    def __del__(self) -> None:
        try:
            if self._fd is not None and os.getpid() == self._pid:
                os.close(self._fd)
        except Exception:
            pass


def _walk_end(w: dict[str, Any], worker: int | None) -> tuple[int, int]:
    """Where a walk left the position: after its last step (the next epoch's start after its last batch)."""
    plan, served = w["plan"], w["served"]
    if not served:
        return plan.epoch, plan.consumed
    b = w["first"] + (served - 1) * w["every"]
    if b + w["every"] >= plan.num_batches and worker is None:
        return plan.epoch + 1, 0
    return plan.epoch, plan.consumed_after(b + 1)


def _nothing() -> None:
    return None


@atexit.register
def _flush_all() -> None:
    """A normal exit closes every live log of this process (a clean stop, as `close()`)."""
    for audit in list(_LIVE):
        try:
            if os.getpid() == audit._pid and audit._fd is not None:
                audit.close()
        except Exception:
            pass
