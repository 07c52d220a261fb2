"""Worker processes that never outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux), even on `kill -9`.

    Without it, pool workers of a killed `dataflow tokenize` or loader keep burning CPU as orphans.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
