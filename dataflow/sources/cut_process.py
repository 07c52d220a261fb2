"""A compressed input's cut (`pieces.expand`) in a process of its own, started as soon as the run knows its work.

One `.jsonl.zst` is decompressed by one process whatever the number of workers (pieces.py). Done by the
coordinator's feeder thread, that began only once the tokenizer was loaded and proven and the workers had
started: beside them, on cores they need, and under the coordinator's GIL. A child process forked before
the tokenizer loads decompresses the first pieces into their spill files on a core the start leaves idle,
so the workers find them waiting; later pieces come at the rate the workers take them (a bounded queue,
`depth` bundles ahead). The bundles, pieces and spill files are exactly those `expand` gives in this process.

Everything else (plain files, files read whole by the workers, pieces that travel with their bytes to other
machines, platforms without fork) is read lazily in this process, as before: `read_bundles` decides.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Iterable, Iterator

from dataflow.errors import DataflowError, InputError
from dataflow.lifetime import die_with_parent
from dataflow.sources.pieces import compressed_file, expand

if TYPE_CHECKING:
    from dataflow.sources.records import Unit

POLL_S = 0.2  # how often a consumer waiting for the next bundle checks that the cutting process lives


class Reading:
    """The bundles of one reading of the input, in order; `close()` ends it (at once: a reading may be
    dropped half-way, its spill folder with it). This one reads lazily, in the iterating thread."""

    def __init__(self, bundles: Iterable[list["Unit"]]) -> None:
        self._bundles = bundles

    def __iter__(self) -> Iterator[list["Unit"]]:
        return iter(self._bundles)

    def close(self) -> None:
        """Nothing runs on its own here."""


class CutProcess(Reading):
    """`expand(...)` run by a child process started now, at most `depth` bundles ahead of the iteration."""

    def __init__(self, bundles: list[list["Unit"]], piece_bytes: int, first_piece: int, spill_dir: str,
                 depth: int) -> None:
        context = multiprocessing.get_context("fork")
        self._queue = context.Queue(maxsize=max(depth, 1))
        self._name = next(b[0].file for b in bundles if compressed_file(b))
        self._process = context.Process(target=_cut, name="dataflow-cut", daemon=True,
                                         args=(bundles, piece_bytes, first_piece, spill_dir, self._queue))
        self._process.start()

    def __iter__(self) -> Iterator[list["Unit"]]:
        while True:
            kind, value = pickle.loads(self._next())
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    def _next(self) -> bytes:
        """The next message of the child; an `InputError` if it ended without saying so (killed)."""
        while True:
            try:
                return self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if self._process.exitcode is None:
                    continue
            try:  # it ended: what it sent before is still in the pipe
                return self._queue.get(timeout=POLL_S)
            except queue.Empty:
                raise InputError(f"{self._name}: the process decompressing it stopped (exit code "
                                 f"{self._process.exitcode}); run the same command again to resume") from None

    def close(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()
        self._process.join(timeout=5)
        self._queue.close()


def read_bundles(bundles: list[list["Unit"]], piece_bytes: int, first_piece: int = 0, spill_dir: str | None = None,
                 whole: bool = False, depth: int = 4) -> Reading:
    """The bundles `expand(bundles, ...)` gives, read ahead by a child process when there is a compressed
    file to cut into spill files here (see the module), else lazily in this process."""
    cut_here = spill_dir is not None and not whole and any(compressed_file(b) for b in bundles)
    if cut_here and sys.platform.startswith("linux"):
        return CutProcess(bundles, piece_bytes, first_piece, spill_dir, depth)
    return Reading(expand(bundles, piece_bytes, first_piece, spill_dir, whole))


def _cut(bundles: list[list["Unit"]], piece_bytes: int, first_piece: int, spill_dir: str,
         out: "multiprocessing.Queue[bytes]") -> None:
    """The child: every bundle of `expand`, then "end", or the error that stopped it (pickled here, so that an
    exception that cannot be pickled still reaches the parent as one that can)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle: it stops this process
    try:
        for bundle in expand(bundles, piece_bytes, first_piece, spill_dir):
            out.put(pickle.dumps(("bundle", bundle)))
        out.put(pickle.dumps(("end", None)))
    except BaseException as e:  # noqa: BLE001  (handed to the parent, which raises it)
        out.put(_pickled_error(e))
    out.close()
    out.join_thread()


def _pickled_error(e: BaseException) -> bytes:
    if not isinstance(e, DataflowError) and hasattr(e, "add_note"):  # a bug: keep where it happened (3.11+)
        e.add_note("in the cut process:\n" + traceback.format_exc().rstrip())
    try:
        data = pickle.dumps(("error", e))
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001
        return pickle.dumps(("error", RuntimeError(f"{type(e).__name__}: {e}")))
