"""Every `DATAFLOW_*` environment variable, read and checked in one place.

Each variable is declared once in `VARIABLES` (what it means, its default); code reads it through the typed
getters below, at the moment it needs it. A value that cannot be used is one `ConfigError` line naming the
variable, the value and what to write instead: never a traceback, never a silent default.
"""

from __future__ import annotations

import math
import os

from dataflow.errors import ConfigError

# name -> (kind, what it means); the kind says which getter reads it and how `check_all` checks it
VARIABLES: dict[str, tuple[str, str]] = {
    "DATAFLOW_CACHE": ("text", "folder of the local shard cache (default $XDG_CACHE_HOME/dataflow, else "
                               "~/.cache/dataflow)"),
    "DATAFLOW_CACHE_LIMIT": ("size", "bytes the cache may hold, like 50GB, or none (default: a share of the free "
                                     "disk)"),
    "DATAFLOW_DEBUG": ("flag", "1: full tracebacks instead of one-line errors"),
    "DATAFLOW_READ_TIMEOUT_S": ("seconds", "seconds a remote read may stay silent before it is retried "
                                           "(default 60)"),
    "DATAFLOW_MIN_TRANSFER_BPS": ("number", "bytes/s below which a shard download, measured over the last "
                                            "DATAFLOW_SLOW_TRANSFER_S, is stopped and retried (default 1024; 0: "
                                            "no floor)"),
    "DATAFLOW_SLOW_TRANSFER_S": ("seconds", "seconds a shard download may stay below DATAFLOW_MIN_TRANSFER_BPS "
                                            "(default 30)"),
    "DATAFLOW_RANGE_BYTES": ("size", "a remote shard over twice this size is downloaded as ranged GETs of "
                                     "this size, a few at once, the shard needed first ahead (default 8MB; none: "
                                     "one GET per shard)"),
    "DATAFLOW_WHOLE_SHARDS": ("flag", "1: a remote zstd Arrow shard is read only once downloaded whole (default: "
                                      "the record batches a reader needs first come as ranged GETs meanwhile)"),
    "DATAFLOW_FIRST_CONTACT_S": ("seconds", "seconds a dataset's first remote read (its manifest) may take in "
                                            "all, retries included (default 120)"),
    "DATAFLOW_MANIFEST_MAX_BYTES": ("size", "the most bytes a dataset's index.json is read to, like 2GB, or none "
                                            "(default 1GB; a million shards take about 200 MB)"),
    "DATAFLOW_JOURNAL_SECONDS": ("number", "tokenize saves its resume journal at most this often (default 1)"),
    "DATAFLOW_GIGATOKEN_CACHE_MB": ("megabytes", "growth in MB after which the gigatoken engine starts afresh "
                                                 "(default 256)"),
    "DATAFLOW_PROOF_CACHE": ("text", "folder where tokenizer engine proofs are remembered"),
    "DATAFLOW_WATCHDOG_S": ("number", "seconds a loader may wait for one batch before it logs what each of its "
                                      "workers is doing, and again each time as long (default 300; 0: never)"),
}


def check_all() -> None:
    """Check every DATAFLOW_* variable that is set, at once (the CLI calls this before any work), so that a bad
    value stops a command before it writes anything, not halfway through."""
    for name, (kind, _) in VARIABLES.items():
        if kind == "flag":
            flag(name)
        elif kind == "size":
            size(name)
        elif kind == "seconds":
            number(name, 1.0, minimum=0.001)
        elif kind == "megabytes":
            number(name, 1.0, minimum=1)
        elif kind == "number":
            number(name, 1.0)
    unknown = sorted(k for k in os.environ if k.startswith("DATAFLOW_") and k not in VARIABLES)
    if unknown:
        import logging

        logging.getLogger("dataflow").warning("ignoring unknown environment variable(s) %s (known: %s)",
                                              ", ".join(unknown), ", ".join(VARIABLES))


def _raw(name: str) -> str | None:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a declared DATAFLOW_* variable (add it to dataflow/env.py)")
    value = os.environ.get(name)
    return value if value is not None and value.strip() != "" else None


def _bad(name: str, value: str, want: str) -> ConfigError:
    return ConfigError(f"environment variable {name}={value!r} is not {want}; fix or unset it "
                       f"({name}: {VARIABLES[name][1]})")


def text(name: str, default: str | None = None) -> str | None:
    """The variable as a string, or `default` when unset or empty."""
    value = _raw(name)
    return default if value is None else value


def flag(name: str) -> bool:
    """True for 1/true/yes/on, False when unset or 0/false/no/off; anything else is an error."""
    value = _raw(name)
    if value is None:
        return False
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise _bad(name, value, "1 or 0")


def number(name: str, default: float, *, minimum: float = 0.0) -> float:
    """A finite number >= `minimum` (seconds, megabytes ...), or `default` when unset."""
    value = _raw(name)
    if value is None:
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise _bad(name, value, "a number") from None
    if not math.isfinite(parsed) or parsed < minimum:
        raise _bad(name, value, f"a finite number >= {minimum:g}")
    return parsed


def size(name: str) -> int | str | None:
    """A size like 50GB (bytes as an int), "none" as it is, or None when unset."""
    value = _raw(name)
    if value is None:
        return None
    if value.strip().lower() in ("none", "unlimited", "0"):
        return "none"
    from dataflow.sizes import parse_size

    try:
        return parse_size(value)
    except ConfigError:
        raise _bad(name, value, "a size like 50GB, 1048576 or none") from None


def cache_dir() -> str:
    """The machine's dataflow cache folder: `$DATAFLOW_CACHE`, else `$XDG_CACHE_HOME/dataflow`, else
    `~/.cache/dataflow` (the shard cache, and the local work folders of tokenize runs on object storage)."""
    chosen = text("DATAFLOW_CACHE")
    if chosen:
        return chosen
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "dataflow")
