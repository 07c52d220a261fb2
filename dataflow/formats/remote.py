"""What every remote read shares: default timeouts, which failures are worth retrying, and the retry loop.

fsspec backends wait as long as a server keeps a connection open; a server that accepts and never
answers would hang a training job. `with_timeouts` adds connect and read timeouts for HTTP(S) and S3
unless the caller's `storage_options` already say something about them (`DATAFLOW_READ_TIMEOUT_S`,
default 60 s, sets the read timeout). Transient failures (5xx/408/429, resets, timeouts) are retried
with jittered exponential backoff; others are raised at once.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, TypeVar

from dataflow import env

log = logging.getLogger(__name__)

RETRIES = 5  # attempts per read
BACKOFF_S = 0.2  # first retry delay; doubles each attempt (with jitter), capped at 10 s
CONNECT_TIMEOUT_S = 30.0
T = TypeVar("T")


def read_timeout_s() -> float:
    return env.number("DATAFLOW_READ_TIMEOUT_S", 60.0, minimum=0.001)


def with_timeouts(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """`options` plus default connect/read timeouts for `url`'s backend, unless they set their own."""
    out = dict(options or {})
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    if protocol in ("http", "https"):
        client = dict(out.get("client_kwargs") or {})
        if "timeout" not in client:
            import aiohttp

            client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                                      sock_read=read_timeout_s())
            out["client_kwargs"] = client
    elif protocol in ("s3", "s3a"):
        config = dict(out.get("config_kwargs") or {})
        if "read_timeout" not in config and "connect_timeout" not in config:
            config.update(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=read_timeout_s())
            out["config_kwargs"] = config
    return out


def transient(e: BaseException) -> bool:
    """Worth retrying: 5xx/408/429, connection resets, timeouts; not 4xx, not a missing file."""
    if isinstance(e, (PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    s = status(e)
    if s is not None:
        return s >= 500 or s in (408, 429)
    if isinstance(e, FileNotFoundError):  # fsspec's http reports every failed request so: its cause tells
        cause = e.__cause__ or e.__context__
        return cause is not None and transient(cause)
    return isinstance(e, (OSError, TimeoutError, EOFError)) or _from_aiohttp(e)


def _from_aiohttp(e: BaseException) -> bool:
    return any(c.__module__.split(".")[0] == "aiohttp" for c in type(e).__mro__)


def status(e: BaseException) -> int | None:
    """The HTTP status of a server's answer (aiohttp's ClientResponseError, gcsfs's HttpError), else None;
    aiohttp's errors about a broken transfer also carry a code, which is not the server's."""
    if _from_aiohttp(e):
        s = getattr(e, "status", None) if hasattr(e, "request_info") else None
    else:
        s = getattr(e, "status", None) or getattr(e, "code", None)
    return s if isinstance(s, int) and 100 <= s < 600 else None


def describe(e: BaseException) -> str:
    s, text = status(e), str(e) or type(e).__name__
    return f"HTTP {s}: {text}" if s is not None and str(s) not in text else text


def backoff(url: str, attempt: int, e: BaseException, level: int = logging.WARNING) -> None:
    """Sleep before attempt `attempt + 1`, saying why (at `level`)."""
    delay = min(BACKOFF_S * 2 ** (attempt - 1), 10.0) * (0.5 + random.random())
    log.log(level, "%s: attempt %d failed (%s); retrying in %.1fs", url, attempt, describe(e), delay)
    time.sleep(delay)


def with_retries(url: str, read: Callable[[], T], retries: int = RETRIES) -> T:
    """`read()`, retried on transient failures; the last failure is raised as it came."""
    for attempt in range(1, retries + 1):
        try:
            return read()
        except Exception as e:
            if attempt == retries or not transient(e):
                raise
            backoff(url, attempt, e, logging.INFO)  # a short read: the final error says enough
    raise AssertionError("unreachable")
