"""Stopping a run on SIGTERM/SIGINT: after the current step with a checkpoint, or at once on a second signal."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Copies of one stop request arrive within milliseconds of each other; a second request is a person's, later.
SAME_REQUEST_S = 2.0
_installed: list["StopFlag"] = []  # the StopFlag whose handlers and wakeup fd this process has now
_fork_masks = threading.local()


class StopFlag:
    """SIGTERM/SIGINT: the first finishes the current step, saves a checkpoint and leaves; a second one stops at
    once, without a checkpoint.

    A step is mostly long C++ operations, during which Python signal handlers cannot run (a step of a config far
    beyond the machine may take an hour). So the signal also wakes a watcher thread through the wakeup fd, which
    answers at once: it says what will happen, and on the second signal ends the process (loader workers leave
    when their parent is gone).

    One signal sent once reaches the trainer more than once, and each copy must not count as a second request:
    - Its own children: a signal to the process group (a terminal's Ctrl-C, `timeout`, torchrun's agent, which
      signals each rank's group) also reaches the forked loader workers, and a forked child inherits the signal
      handlers and the wakeup fd, so its copy landed in this process's pipe. Children forked while a flag is
      installed therefore start without the wakeup fd and with a handler that does nothing (`_after_fork_child`):
      the stop is the trainer's to carry out, and its workers must serve the batches of the last step (they
      leave when the trainer closes the loader or its process is gone). The two signals are blocked in the
      forking thread across fork(), so no copy can arrive in the child before that reset.
    - Its senders: `timeout` signals its child and then the child's group; a scheduler (Slurm's preemption)
      signals every process of the job, and the launcher then passes the signal on to its ranks. These are
      signals from other processes, ordinary ones, that only their timing tells apart from a person's second
      request; POSIX gives a handler no sender in Python, and `sigwaitinfo` (which does) needs the signals
      blocked in every thread of the process, which would leak into every program it starts. So a signal
      within SAME_REQUEST_S of the first is the same request; one at least that long after it is a second.
    """

    def __init__(self, announce: bool = True) -> None:
        self.set = False
        self.announce = announce
        self.previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup = (read, write)
        _installed.append(self)
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="trainer-signals", daemon=True)
        self._watcher.start()

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True

    def _say(self, text: str) -> None:
        if self.announce:
            os.write(2, f"{text}\n".encode())

    def _watch(self, read: int) -> None:
        first: float | None = None  # when the first stop signal was read
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data or 0 in data:  # restore() is done with us
                return
            now = time.monotonic()
            for signum in data:
                if signum not in STOP_SIGNALS:
                    continue
                self.set = True
                name = signal.Signals(signum).name
                if first is None:
                    first = now
                    self._say(f"{name}: stopping after the current step (with a checkpoint when checkpoint.dir "
                              f"is set); send it again, {SAME_REQUEST_S:g} s or more after the first, to stop at once")
                elif now - first >= SAME_REQUEST_S:
                    self._say(f"{name} again: stopped at once, without a checkpoint")
                    os._exit(128 + signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            _installed.remove(self)
            signal.set_wakeup_fd(self._old_fd)
            os.write(self._wakeup[1], b"\0")  # wake the watcher so that it ends before its fd is closed
            self._watcher.join()
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None


def _ignore(signum: int, frame: Any) -> None:
    """A forked child's handler for the trainer's stop signals: the trainer stops it (not SIG_IGN, which a
    program the child might exec would inherit)."""


def _before_fork() -> None:
    if _installed:
        _fork_masks.mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def _after_fork_parent() -> None:
    mask = getattr(_fork_masks, "mask", None)
    if mask is not None:
        _fork_masks.mask = None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _after_fork_child() -> None:
    """In a child forked while a StopFlag is installed: no wakeup fd (it is the parent's pipe), no stop handler;
    then the signals blocked across fork() are let through to the handler that does nothing."""
    mask = getattr(_fork_masks, "mask", None)
    if _installed:
        _installed.clear()
        signal.set_wakeup_fd(-1)
        for sig in STOP_SIGNALS:
            signal.signal(sig, _ignore)
    if mask is not None:
        _fork_masks.mask = None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)
