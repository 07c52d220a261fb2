"""`Watchdog`: a loader that has produced nothing for `after_s` seconds says what each of its processes is doing.

The loader runs its batches through `watch()`, which notes when it asks for the next one and when it arrives;
a daemon thread looks every second. When a wait passes `after_s` (and again every `after_s` while it lasts),
one warning on the `dataflow` logger names the batch awaited and, for each process that builds batches:
- what the OS says of it (Linux `/proc`): running or asleep and in which kernel wait, the CPU seconds and
  bytes it read since the last look (is it working, is it downloading), the data files it holds open;
- its Python stack and the stage that stack is in (the innermost dataflow module on it): the main
  process's from `sys._current_frames()`; a worker's through `faulthandler`, registered here for
  `STACK_SIGNAL` before the workers fork (they inherit it). Workers started another way (spawn) did not
  register, and are never sent the signal (it would end them): the OS figures stand alone for them.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
STACK_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
CHECK_S = 1.0
STACK_WAIT_S = 0.5  # how long a signalled worker has to write its stack
STAGES = {"download": "fetch (downloading a shard)", "storage": "fetch", "cache": "fetch (the shard cache)",
          "locks": "fetch (waiting for a cache lock)", "decoded": "decode", "reader": "read", "shards": "read",
          "index": "shuffle", "shuffle": "shuffle", "handoff": "hand-off", "ring": "hand-off"}
_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
_DATA_SUFFIXES = (".arrow", ".tar", ".zst", ".part", ".bin", ".idx", ".json", ".jsonl", ".parquet")
log = logging.getLogger("dataflow.loading.watchdog")


class Watchdog:
    """Watches one loader's waits; `pids()` gives its worker processes (empty without workers)."""

    def __init__(self, after_s: float, name: str, pids: Callable[[], list[int]]):
        self.after_s, self.name, self.pids = float(after_s), name, pids
        self._asked: float | None = None  # when the batch being waited for was asked for
        self._what, self._thread_id, self._reports = "", 0, 0
        self._last: dict[int, tuple[float, int]] = {}  # pid -> (cpu s, bytes read) at the last look
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._stacks: tuple[str, object] | None = None  # (file, its open handle) the workers dump into

    def prepare_fork(self) -> None:
        """Before workers fork: register the stack dump they inherit (once; a no-op where unsupported)."""
        if self._stacks is not None or STACK_SIGNAL is None:
            return
        fd, path = tempfile.mkstemp(prefix="dataflow-stacks-", suffix=".txt")
        handle = os.fdopen(fd, "w")
        # Unregister first: a framework that restores every signal's Python handler (Lightning's teardown does)
        # sets SIG_DFL over faulthandler's C handler, and `register` then believes it is still installed.
        faulthandler.unregister(STACK_SIGNAL)
        faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
        self._stacks = (path, handle)

    def watch(self, items: Iterable[T], what: Callable[[int], str]) -> Iterator[T]:
        """`items`, with each wait for the next one watched; `what(b)` names the b-th for the report."""
        self._start()
        it, b = iter(items), 0
        while True:
            self._what, self._thread_id, self._reports = what(b), threading.get_ident(), 0
            self._asked = time.monotonic()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                self._asked = None
            b += 1
            yield item

    def stop(self) -> None:
        """The thread ends at its next look (never joined: this may run in `__del__`, wherever GC runs)."""
        self._stop.set()
        self._watcher = None

    def _start(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._stop = threading.Event()
            self._watcher = threading.Thread(target=self._run, args=(self._stop,), name="dataflow-watchdog",
                                             daemon=True)
            self._watcher.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(min(CHECK_S, self.after_s)):
            asked = self._asked
            if asked is None:
                continue
            waited = time.monotonic() - asked
            if waited >= self.after_s * (self._reports + 1):
                self._reports += 1
                try:
                    log.warning(self.report(waited))
                except Exception as e:  # a report must never take the loader down
                    log.warning("%s: no batch for %.0f s (and no report: %s)", self.name, waited, e)

    # --- the report -----------------------------------------------------------------------------------
    def report(self, waited: float) -> str:
        """What the loader waits for and what each of its batch-building processes is doing."""
        lines = [f"{self.name}: no batch for {waited:.0f} s, waiting for {self._what}; what its processes are doing:"]
        pids = self.pids()
        if not pids:
            frame = sys._current_frames().get(self._thread_id)
            stack = traceback.format_stack(frame) if frame is not None else []
            lines.append(f"  this process (pid {os.getpid()}, no workers): {_os_figures(os.getpid(), self._last)}")
            lines += _stack_lines(stack)
        for w, pid in enumerate(pids):
            lines.append(f"  worker {w} (pid {pid}): {_os_figures(pid, self._last)}")
            lines += _stack_lines(self._worker_stack(pid))
        return "\n".join(lines)

    def _worker_stack(self, pid: int) -> list[str]:
        """The Python stack of worker `pid`, dumped by faulthandler into the shared file ([] if unavailable)."""
        if self._stacks is None:
            return []
        path, _ = self._stacks
        if not _catches(pid, STACK_SIGNAL):  # not (yet) its handler: the signal would end the worker
            return []
        start = os.path.getsize(path)
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            return []
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if os.path.getsize(path) > start:
                time.sleep(0.05)  # let it finish the dump
                break
        with open(path) as f:
            f.seek(start)
            return _faulthandler_frames(f.read())


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` now (Linux: its SigCgt mask); False where it cannot be told."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(caught >> (int(sig) - 1) & 1)


def _stack_lines(stack: list[str]) -> list[str]:
    """The stage the stack is in, then its innermost frames (the most recent last)."""
    if not stack:
        return []
    return [f"    stage: {_stage(stack)}; Python stack, most recent call last:"] + \
           [f"      {line.strip()}" for frame in stack[-10:] for line in frame.strip().splitlines()[:1]]


def _stage(stack: list[str]) -> str:
    """The pipeline stage of the innermost frame that is not the standard library's, or where it stands outside."""
    frames = [m.groups() for m in map(_FRAME.search, stack) if m is not None]
    ours = [f for f in frames if not (f[0].startswith("<") or "/lib/python3" in f[0] and "-packages" not in f[0])]
    if not ours:
        return "unknown"
    path, line, func = ours[-1]
    if "/dataflow/" in path:
        stem = os.path.splitext(os.path.basename(path))[0]
        return f"{STAGES.get(stem, stem)} (in {func}, dataflow/{path.split('/dataflow/')[-1]}:{line})"
    caller = next((f for f in reversed(ours) if "/dataflow/" in f[0]), None)
    called = f", called from dataflow/{caller[0].split('/dataflow/')[-1]}:{caller[1]}" if caller else ""
    return f"outside dataflow, in {func} ({os.path.basename(path)}:{line}){called}"


def _faulthandler_frames(dump: str) -> list[str]:
    """faulthandler's text (most recent call first, all threads) -> the current thread's frames, oldest first."""
    threads = [t for t in dump.split("\n\n") if t.strip()]
    current = next((t for t in threads if "handoff.py" in t), None)  # the worker's own thread, filling batches
    current = current or next((t for t in threads if t.startswith("Current thread")), threads[0] if threads else "")
    return [line.strip() for line in current.splitlines()[1:] if line.strip().startswith("File")][::-1]


def _os_figures(pid: int, last: dict[int, tuple[float, int]]) -> str:
    """Linux /proc: state, kernel wait, CPU and bytes read since the last look, open data files."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        state, cpu = fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        wchan = _read(f"/proc/{pid}/wchan") or "?"
        io = dict(line.split(": ") for line in (_read(f"/proc/{pid}/io") or "").splitlines() if ": " in line)
    except (OSError, IndexError, ValueError):
        return "(no /proc figures: not Linux, or the process is gone)"
    read = int(io.get("rchar", 0))
    cpu0, read0 = last.get(pid, (cpu, read))
    last[pid] = (cpu, read)
    doing = {"R": "running", "S": f"asleep in {wchan}", "D": f"in uninterruptible I/O ({wchan})"}.get(state, state)
    files = _open_files(pid)
    return (f"{doing}, {cpu:.1f} CPU s (+{cpu - cpu0:.1f} since the last look), {read / 1e6:,.1f} MB read "
            f"(+{(read - read0) / 1e6:,.1f})" + (f", open: {', '.join(files)}" if files else ""))


def _open_files(pid: int) -> list[str]:
    """Data files the process holds open (shards, downloads in progress), at most four."""
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(("/dev/", "/proc/")) and \
                target.endswith(_DATA_SUFFIXES) and "dataflow-stacks-" not in target:
            found.append(target)
    return sorted({os.path.basename(f) for f in found})[:4]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
