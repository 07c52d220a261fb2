"""How a loader worker ended, said for a person: the signal or exit code and what to do; its exception restored."""

from __future__ import annotations

import pickle
import signal

from dataflow.errors import DataflowError

_SIGNAL_HINTS = {
    signal.SIGKILL: "the kernel's out-of-memory killer sends SIGKILL: lower num_workers or shuffle_window, or "
                    "give the job more memory",
    signal.SIGBUS: "a bus error in a worker is most often /dev/shm running out: give the container more shared "
                   "memory (Docker: --shm-size) or lower num_workers, held_batches or batch_size",
    signal.SIGSEGV: "a crash in native code: please report it with the versions of torch and pyarrow",
}


def how_it_ended(exitcode: int | None) -> tuple[str, str]:
    """(how a worker ended, what to do about it) from its exit code (negative: the signal that killed it)."""
    if exitcode is None:
        return "it closed its pipes but is still running", "it is being stopped; retry"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return f"killed by signal {-exitcode}", "killed by another process or out of memory?"
        return f"killed by {sig.name}", _SIGNAL_HINTS.get(sig, "killed by another process?")
    return f"exited with code {exitcode}", "see the worker's output above for why"


def restore_error(payload: bytes | None, text: str, worker: int) -> BaseException:
    """The exception a worker sent (pickled), with its type and message; else its traceback's text."""
    if payload is not None:
        try:
            exc = pickle.loads(payload)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    return DataflowError(f"loader worker {worker} failed:\n{text}")
