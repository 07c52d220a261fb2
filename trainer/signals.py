"""Stopping a run on SIGTERM/SIGINT: after the current step with a checkpoint, or at once on a second signal."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


class StopFlag:
    """SIGTERM/SIGINT: the first finishes the current step, saves a checkpoint and leaves; a second one stops at
    once, without a checkpoint.

    A step is mostly long C++ operations, during which Python signal handlers cannot run (a step of a config far
    beyond the machine may take an hour). So the signal also wakes a watcher thread through the wakeup fd, which
    answers at once: it says what will happen, and on the second signal ends the process (loader workers leave
    when their parent is gone).
    """

    def __init__(self, announce: bool = True) -> None:
        self.set = False
        self.announce = announce
        self.previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup = (read, write)
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="trainer-signals", daemon=True)
        self._watcher.start()

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True

    def _say(self, text: str) -> None:
        if self.announce:
            os.write(2, f"{text}\n".encode())

    def _watch(self, read: int) -> None:
        seen = 0
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data or 0 in data:  # restore() is done with us
                return
            for signum in data:
                if signum not in (signal.SIGTERM, signal.SIGINT):
                    continue
                seen += 1
                self.set = True
                name = signal.Signals(signum).name
                if seen == 1:
                    self._say(f"{name}: stopping after the current step (with a checkpoint when checkpoint.dir "
                              f"is set); send it again to stop at once")
                else:
                    self._say(f"{name} again: stopped at once, without a checkpoint")
                    os._exit(128 + signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_fd)
            os.write(self._wakeup[1], b"\0")  # wake the watcher so that it ends before its fd is closed
            self._watcher.join()
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None
