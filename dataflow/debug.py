"""Debug mode: the user asked (`--debug`, `DATAFLOW_DEBUG=1`) for full tracebacks instead of one-line errors."""

from __future__ import annotations

from dataflow import env
from dataflow.errors import ConfigError


def debug_enabled() -> bool:
    """True when the user asked for full tracebacks (`--debug` sets `DATAFLOW_DEBUG=1`)."""
    try:
        return env.flag("DATAFLOW_DEBUG")
    except ConfigError:
        return True  # a value that is neither on nor off: show the tracebacks it probably asked for


def cause(e: BaseException) -> BaseException | None:
    """What to chain a user-facing error to: the original exception in debug mode, else nothing."""
    return e if debug_enabled() else None
