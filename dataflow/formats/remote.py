"""What every remote read shares: default timeouts, which failures are worth retrying, and the retry loop.

fsspec backends wait as long as a server keeps a connection open; a server that accepts and never
answers would hang a training job. `with_timeouts` adds connect and read timeouts for HTTP(S) and S3
unless the caller's `storage_options` already say something about them (`DATAFLOW_READ_TIMEOUT_S`,
default 60 s, sets the read timeout). Transient failures (5xx/408/429, resets, timeouts) are retried
with jittered exponential backoff; others are raised at once.

A dataset's first contact (its manifest, `with_retries`) has a budget for all its attempts together
(`DATAFLOW_FIRST_CONTACT_S`, default 120 s, or `first_contact(seconds)`): a server that says nothing is
warned about once a read timeout has passed, and is an `UnreachableError` when the budget is spent,
whatever the backend does inside an attempt. Shard downloads keep the per-read timeouts and retries, and
have a progress floor (`ProgressFloor`): a transfer whose bytes keep coming, each read within the read
timeout, but fewer than `DATAFLOW_MIN_TRANSFER_BPS` (default 1024) a second over the last
`DATAFLOW_SLOW_TRANSFER_S` (default 30) seconds is stopped, after one warning, as `TooSlow`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import posixpath
import random
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import quote, unquote

from fsspec.callbacks import Callback

from dataflow import env
from dataflow.debug import cause
from dataflow.errors import FormatError, UnreachableError
from dataflow.formats.remote_errors import chain, first_line

log = logging.getLogger(__name__)

RETRIES = 5  # attempts per read
BACKOFF_S = 0.2  # first retry delay; doubles each attempt (with jitter), capped at 10 s
CONNECT_TIMEOUT_S = 30.0
FIRST_CONTACT_S = 120.0  # default budget of a dataset's first contact, all attempts together
MIN_TRANSFER_BPS = 1024.0  # default progress floor of a transfer, bytes per second ...
SLOW_TRANSFER_S = 30.0  # ... over the last this many seconds
T = TypeVar("T")
_budget: contextvars.ContextVar[float | None] = contextvars.ContextVar("first_contact_budget", default=None)
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("first_contact_deadline", default=None)


class TooSlow(Exception):
    """A transfer below the progress floor over a whole span (a trickle): worth a retry on a fresh connection."""

    def __init__(self, rate: float, floor: float, span: float):
        super().__init__(f"{rate:.0f} B/s over the last {span:g} s, below the floor of {floor:g} B/s")
        self.rate, self.floor, self.span = rate, floor, span


class ProgressFloor(Callback):
    """fsspec's transfer callback (`fs.get_file(..., callback=floor)`) that raises `TooSlow` inside the transfer
    when fewer than `floor` bytes/s arrived over the last `span` seconds, after warning once (per `ProgressFloor`,
    whatever the attempts) when the rate over the last half span first falls below it. Measured over that
    sliding span, never per read: a stall inside a healthy transfer is fine. The clock starts at `restart()`
    (call it before each attempt) and again when the answer's size arrives; a complete transfer is never
    stopped. A floor of 0 turns it off."""

    def __init__(self, name: str, floor: float | None = None, span: float | None = None):
        super().__init__()
        self.name = name
        self.floor = min_transfer_bps() if floor is None else floor
        self.span = slow_transfer_s() if span is None else span
        self.warned = False
        self.restart()

    def restart(self) -> None:
        """A new attempt: no bytes yet, the clock starts now."""
        self.size, self.value, self._answered = None, 0, False
        self._samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])

    def call(self, *args: Any, **kwargs: Any) -> None:  # every set_size/relative_update ends here
        now = time.monotonic()
        if not self._answered and self.value == 0:  # the answer came: the wait for it is the read timeout's
            self._samples = deque([(now, 0)])
        self._answered = True
        if self.size is not None and self.value >= self.size:
            return
        samples = self._samples
        if now - samples[-1][0] >= self.span / 32:  # a few dozen samples per span, whatever the chunk size
            samples.append((now, self.value))
        while len(samples) > 1 and samples[1][0] <= now - self.span:
            samples.popleft()  # keeps the newest sample at least a span old
        half, full = self._rate(now, self.span / 2), self._rate(now, self.span)
        low = [r for r in (half, full) if r is not None and r < self.floor]
        if low and not self.warned:
            self.warned = True
            log.warning("%s: receiving %.0f B/s, below the floor of %g B/s (DATAFLOW_MIN_TRANSFER_BPS); the transfer "
                        "is stopped if that lasts %g s (DATAFLOW_SLOW_TRANSFER_S)", self.name, low[0], self.floor,
                        self.span)
        if full is not None and full < self.floor:
            raise TooSlow(full, self.floor, self.span)

    def _rate(self, now: float, seconds: float) -> float | None:
        """Bytes/s since the newest sample at least `seconds` old; None before the transfer is that old."""
        ref = None
        for t, value in self._samples:
            if t > now - seconds:
                break
            ref = (t, value)
        return None if ref is None else (self.value - ref[1]) / max(now - ref[0], 1e-9)


def is_remote(url: str) -> bool:
    """An fsspec URL other than `file://` (read through fsspec and downloads, not in place)."""
    return "://" in url and not url.startswith("file://")


def local_path(url: str) -> str:
    """`file://PATH` is the local PATH (`file:///abs/x` is `/abs/x`); any other path or URL as given. A
    command never makes a folder named after the scheme (`file:`)."""
    return url[len("file://"):] if url.startswith("file://") else url


def read_timeout_s() -> float:
    return env.number("DATAFLOW_READ_TIMEOUT_S", 60.0, minimum=0.001)


def min_transfer_bps() -> float:
    return env.number("DATAFLOW_MIN_TRANSFER_BPS", MIN_TRANSFER_BPS)


def slow_transfer_s() -> float:
    return env.number("DATAFLOW_SLOW_TRANSFER_S", SLOW_TRANSFER_S, minimum=0.001)


def first_contact_s() -> float:
    """Seconds a dataset's first contact may take in all: `first_contact(...)`'s, else DATAFLOW_FIRST_CONTACT_S."""
    chosen = _budget.get()
    return chosen if chosen is not None else env.number("DATAFLOW_FIRST_CONTACT_S", FIRST_CONTACT_S, minimum=0.001)


@contextlib.contextmanager
def first_contact(seconds: float | None) -> Iterator[None]:
    """Within this block, `with_retries` gives up after `seconds` in all (None: DATAFLOW_FIRST_CONTACT_S)."""
    token = _budget.set(seconds)
    try:
        yield
    finally:
        _budget.reset(token)


def with_timeouts(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """`options` plus default connect/read timeouts for `url`'s backend, unless they set their own."""
    out = dict(options or {})
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    deadline = _deadline.get()  # within a first contact: no request outlives its budget
    left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
    connect, read = (CONNECT_TIMEOUT_S, read_timeout_s()) if left is None else \
        (min(CONNECT_TIMEOUT_S, left), min(read_timeout_s(), left))
    if left is not None:  # timeouts made for this moment: no cached filesystem (and session) per value
        out.setdefault("skip_instance_cache", True)
    if protocol in ("http", "https"):
        client = dict(out.get("client_kwargs") or {})
        if "timeout" not in client:
            import aiohttp

            client["timeout"] = aiohttp.ClientTimeout(total=left, sock_connect=connect, sock_read=read)
            out["client_kwargs"] = client
    elif protocol in ("s3", "s3a"):
        config = dict(out.get("config_kwargs") or {})
        if "read_timeout" not in config and "connect_timeout" not in config:
            config.update(connect_timeout=connect, read_timeout=read)
            out["config_kwargs"] = config
    return out


def escapes_dataset(path: str) -> str | None:
    """The form in which a manifest's relative `path` is absolute, names a drive or holds '..', as written or
    percent-decoded up to four times (`%252e` is `%2e` decoded once, `.` twice: a server or proxy may decode
    it); None when it stays inside the dataset. The one rule of format rule 3, for every reader."""
    seen = path if isinstance(path, str) else ""
    for _ in range(5):
        parts = seen.replace("\\", "/").split("/")
        if not seen or seen.startswith("/") or ".." in parts or ":" in parts[0]:
            return seen
        if unquote(seen) == seen:
            return None
        seen = unquote(seen)
    return seen  # still changing after four decodings: refuse it


def shard_url(root: str, path: str) -> str:
    """Where shard `path` (relative, as its manifest writes it) of the remote dataset `root` is. For http(s)
    each segment is percent-quoted, so `#`, `?` and `%` are parts of a name, not of the URL's syntax. A
    path that leaves the dataset once percent-decoded (`%2e%2e/x`: a server or proxy may decode it) is a
    `FormatError`, before anything is requested."""
    escaped = escapes_dataset(path)
    if escaped is not None:
        raise FormatError(f"{root}: shard path {path!r} must be relative and stay inside the dataset, but leaves it "
                          f"(read as {escaped!r}); the manifest is damaged or hostile")
    if root.split("://", 1)[0].lower() in ("http", "https"):
        return root.rstrip("/") + "/" + "/".join(quote(part, safe="") for part in path.split("/"))
    return posixpath.join(root.rstrip("/"), path)


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
    """The HTTP status of a server's answer (aiohttp's ClientResponseError, gcsfs's HttpError, an error carrying
    its `response`), else None;
    aiohttp's errors about a broken transfer also carry a code, which is not the server's."""
    if _from_aiohttp(e):
        s = getattr(e, "status", None) if hasattr(e, "request_info") else None
    else:
        s = getattr(e, "status", None) or getattr(e, "code", None)
        if s is None:  # huggingface_hub's HfHubHTTPError, httpx: on the response
            s = getattr(getattr(e, "response", None), "status_code", None)
    return s if isinstance(s, int) and 100 <= s < 600 else None


def describe(e: BaseException) -> str:
    """What a failed request says, as a message quotes it: its HTTP status, and the first line (at most
    `QUOTED_CHARS`) of what it says (a server that answers garbage makes an exception of tens of KB)."""
    s, text = status(e), first_line(e)
    return f"HTTP {s}: {text}" if s is not None and str(s) not in text else text


def backoff(url: str, attempt: int, e: BaseException, level: int = logging.WARNING, cap: float = 10.0) -> None:
    """Sleep before attempt `attempt + 1` (at most `cap` seconds), saying why (at `level`)."""
    delay = min(min(BACKOFF_S * 2 ** (attempt - 1), 10.0) * (0.5 + random.random()), cap)
    log.log(level, "%s: attempt %d failed (%s); retrying in %.1fs", url, attempt, describe(e), delay)
    time.sleep(delay)


def with_retries(url: str, read: Callable[[], T], retries: int = RETRIES) -> T:
    """`read()` (a dataset's first contact), retried on transient failures within the first-contact budget;
    the last failure is raised as it came, a budget spent waiting is `UnreachableError`."""
    budget = first_contact_s()
    deadline = time.monotonic() + budget
    token = _deadline.set(deadline)
    warned = [False]
    try:
        for attempt in range(1, retries + 1):
            try:
                return _before(url, read, deadline, budget, warned)
            except UnreachableError:
                raise
            except Exception as e:
                left = deadline - time.monotonic()
                if left <= 0 and _timed_out(e):
                    raise _spent(url, budget) from cause(e)
                if attempt == retries or not transient(e) or left <= 0:
                    raise
                loud = _timed_out(e) and not warned[0]  # a server's first silence is said out loud, once
                warned[0] = warned[0] or loud
                backoff(url, attempt, e, logging.WARNING if loud else logging.INFO, cap=left)
        raise AssertionError("unreachable")
    finally:
        _deadline.reset(token)


def _before(url: str, read: Callable[[], T], deadline: float, budget: float, warned: list[bool]) -> T:
    """`read()` in a helper thread, waited for until `deadline` (warning once when a read timeout has passed
    in silence): a backend that retries or waits inside one call cannot overrun the budget."""
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # the deadline, for `with_timeouts` inside `read`

    def run() -> None:
        try:
            box["value"] = context.run(read)
        except BaseException as e:  # handed to the waiting thread
            box["error"] = e

    thread = threading.Thread(target=run, name="dataflow-first-contact", daemon=True)
    thread.start()
    first = min(read_timeout_s(), max(deadline - time.monotonic(), 0.0))
    thread.join(first)
    if thread.is_alive() and not warned[0] and deadline > time.monotonic():
        warned[0] = True
        log.warning("%s: no answer in %.3g s; waiting up to %g s in all (DATAFLOW_FIRST_CONTACT_S)", url,
                    first, budget)
    thread.join(max(deadline - time.monotonic(), 0.0))
    if thread.is_alive():  # left behind: its own timeouts end it, its answer is not awaited
        raise _spent(url, budget)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _spent(url: str, budget: float) -> UnreachableError:
    return UnreachableError(f"{url}: no answer in {budget:g} s, the budget of a dataset's first contact; check the "
                            "URL, the network and the server, or raise DATAFLOW_FIRST_CONTACT_S (or first_contact_s=)")


def _timed_out(e: BaseException) -> bool:
    """Whether `e` (or what caused it) is a timeout: a server that stays silent."""
    return any(isinstance(err, TimeoutError) or "Timeout" in type(err).__name__ for err in chain(e))
