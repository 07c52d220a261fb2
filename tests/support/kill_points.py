"""Deterministic stop points for tokenize's crash tests (a helper, not a test module).

`command(when, *args)` is a `dataflow tokenize` command line whose run stops itself (the whole run: its
workers die with it) at the point `when` names, so a crash test kills the run where it chooses, on any
machine, however fast or loaded: the points are states of the data, never moments. (The test suite saves
the journal after every committed bundle: DATAFLOW_JOURNAL_SECONDS=0.)

`when` holds one condition and optionally "signal" ("KILL", the default, or "INT" as Ctrl-C would):
  {"next_unit": N}     a journal save with N units committed   {"next_piece": N}  ... N pieces of a compressed file
  {"shard": "before"|"during"|"after", "unit": N}  in the worker tokenizing the bundle that starts at unit N
                       (or the first one after it): before its first shard is written, with that shard's temp
                       file cut in its middle, or once the shard is finished but not yet handed back
  {"hold": MARKER, "unit": N}  that worker writes MARKER before its first shard, then waits for ever (a bundle
                       that takes long: for Ctrl-C tests; no signal)
  {"renamed": N}       the coordinator has put the shards of the bundle starting at unit >= N in place, and
                       no journal lists them yet
  {"manifest": true}   the first split's manifest is written, the journal not yet removed
  {"finished": true}   every manifest (and on an object store the error log) is written, the journal not yet removed
  {"pause": [MARKER, GO]} at the first journal save: write MARKER, then wait until the file GO exists
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
MAIN = os.getpid()


def command(when: dict, *args: object) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), json.dumps(when), *map(str, args)]


def ctrl_c_while_holding(unit: int, marker: Path, *args: object) -> tuple[int, str, float]:
    """Run `dataflow *args` until a worker holds the bundle of `unit` (it writes `marker`), then send SIGINT to
    the run's process group as a terminal's Ctrl-C does: (exit code, stderr, seconds from the signal to exit)."""
    proc = subprocess.Popen(command({"hold": str(marker), "unit": unit}, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _stop(when: dict) -> None:
    """Stop the run: the coordinator (and this process, when it is a worker)."""
    sig = signal.SIGINT if when.get("signal") == "INT" else signal.SIGKILL
    os.kill(MAIN, sig)
    if os.getpid() != MAIN:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)


def _pause(marker: str, go: str) -> None:
    Path(marker).touch()
    deadline = time.monotonic() + 600
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("kill point: nobody said go")
        time.sleep(0.02)


def _unit_of(name: str) -> int:
    return int(re.search(r"unit-(\d+)-", os.path.basename(name)).group(1))


def _install_shard_point(when: dict) -> None:
    """Patch the worker's shard writing (inherited by forked workers)."""
    from dataflow.formats import arrow
    from dataflow.formats.writer import ShardWriter

    flush, commit = ShardWriter.flush, arrow.ArrowShardFile.commit

    def stopping_flush(self):
        due = self._shard_docs and _unit_of(self.prefix) >= when["unit"]
        if due and "hold" in when:
            _pause(when["hold"], os.devnull + ".never")
        if due and when.get("shard") == "before":
            _stop(when)
        info = flush(self)
        if due and when.get("shard") == "after":
            _stop(when)
        return info

    def torn_commit(self):
        if _unit_of(self.path) >= when["unit"]:
            _, size = self.sync()
            os.truncate(self.temp_path, size // 2)
            _stop(when)
        return commit(self)

    ShardWriter.flush = stopping_flush
    if when.get("shard") == "during":
        arrow.ArrowShardFile.commit = torn_commit


def _install(when: dict) -> None:
    from dataflow.preprocess import commit, finish, startup

    if "shard" in when or "hold" in when:
        _install_shard_point(when)
    if "renamed" in when:
        commit_bundle = commit.commit_bundle

        def commit_then_stop(result, *args, **kwargs):
            commit_bundle(result, *args, **kwargs)
            if result.unit.index >= when["renamed"]:
                _stop(when)

        commit.commit_bundle = commit_then_stop
    if "manifest" in when:
        write = finish.write_manifest

        def write_then_stop(*args, **kwargs):
            write(*args, **kwargs)
            _stop(when)

        finish.write_manifest = write_then_stop
    if "finished" in when:
        rmtree = finish.shutil.rmtree

        def stop_before_removing(path, *args, **kwargs):
            if os.path.basename(str(path)).startswith("task-"):
                _stop(when)
            rmtree(path, *args, **kwargs)

        finish.shutil.rmtree = stop_before_removing
    save = commit.save_progress
    done = []

    def save_then_stop(work_dir, progress):
        save(work_dir, progress)
        if done or not any(k in when for k in ("next_unit", "next_piece", "pause")):
            return
        if progress.next_unit < when.get("next_unit", 0) or progress.next_piece < when.get("next_piece", 0):
            return
        done.append(True)
        if "pause" in when:
            _pause(*when["pause"])
        else:
            _stop(when)

    startup.save_progress = commit.save_progress = save_then_stop  # the fresh journal, then each save


def kill_at_pieces(args: list, journal, pieces: tuple[int, ...]) -> None:
    """Run `dataflow *args` once per number in `pieces`, each resuming the one before and killed once that many
    pieces of the first file are committed."""
    for piece in pieces:
        p = subprocess.run(command({"next_piece": piece}, *args), capture_output=True, text=True)
        assert p.returncode == -signal.SIGKILL, p.stderr
        progress = json.loads(journal.read_text())
        assert (progress["next_unit"], progress["next_piece"]) == (0, piece), progress


if __name__ == "__main__":
    # this checkout's dataflow, as `python -m dataflow` from its root imports; not this folder, whose modules
    # would stand in for packages of the same name
    sys.path[0] = str(ROOT)
    # Ctrl-C as in a terminal's foreground: a suite started as a background job (`make test &`) hands its
    # processes SIGINT ignored, and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _install(json.loads(sys.argv.pop(1)))
    from dataflow.cli import main

    sys.exit(main(sys.argv[1:]))
