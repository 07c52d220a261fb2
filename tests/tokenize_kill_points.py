"""Deterministic stop points for tokenize's crash tests (a helper, not a test module).

`command(when, *args)` is a `dataflow tokenize` command line whose process stops itself at the first journal
save where its state is the one `when` names, so a crash test kills the run where it chooses, on any machine,
however fast or loaded: the state is read from what the journal saved, which depends on the data and the
settings only. (The test suite saves the journal after every committed unit: DATAFLOW_JOURNAL_SECONDS=0.)

`when` holds one condition and optionally "signal" ("KILL", the default, or "INT" as Ctrl-C would):
  {"next_unit": N}     N units committed           {"next_piece": N}  N pieces of a compressed file committed
  {"open_file": true}  an open shard has record batches in its temp file (and documents in memory)
  {"torn_batch": true} as open_file, then the next record batch of that shard is cut in its middle on disk,
                       as a kill while it is being written leaves it
  {"fresh_shard": true} a shard finished; the open one holds documents in memory (the spill) and no batch yet
  {"pause": [MARKER, GO]} write MARKER, then wait until the file GO exists, and go on (no signal)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(when: dict, *args: object) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), json.dumps(when), *map(str, args)]


def _open_file(splits: dict) -> dict | None:
    return next((s["file"] for s in splits.values() if s.get("file")), None)


def _reached(progress, when: dict) -> bool:
    splits = progress.splits
    if "next_unit" in when:
        return progress.next_unit >= when["next_unit"]
    if "next_piece" in when:
        return progress.next_piece >= when["next_piece"]
    if "open_file" in when or "torn_batch" in when:
        return _open_file(splits) is not None
    if "fresh_shard" in when:
        return any(s["shards"] and not s.get("file") and s["spill_bytes"] > 0 for s in splits.values())
    if "pause" in when:
        return True
    raise ValueError(f"unknown stop point {when}")


def _stop(when: dict) -> None:
    os.kill(os.getpid(), signal.SIGINT if when.get("signal") == "INT" else signal.SIGKILL)


def _pause(marker: str, go: str) -> None:
    Path(marker).touch()
    deadline = time.monotonic() + 600
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("kill point: nobody said go")
        time.sleep(0.02)


def _tear_next_batch(file_state: dict, when: dict) -> None:
    """Cut the next record batch written to the shard `file_state` describes in its middle, then stop."""
    from dataflow.formats import arrow

    add = arrow.ArrowShardFile.add

    def torn_add(self, *args, **kwargs):
        add(self, *args, **kwargs)
        if os.path.basename(self.temp_path) == file_state["temp"]:
            _, size = self.sync()  # the batch is on disk, past what the journal names ...
            os.truncate(self.temp_path, file_state["bytes"] + (size - file_state["bytes"]) // 2)  # ... half of it
            _stop(when)

    arrow.ArrowShardFile.add = torn_add


def _install(when: dict) -> None:
    from dataflow.preprocess import run

    save = run.save_progress
    done = []

    def save_then_stop(work_dir, progress, writers):
        save(work_dir, progress, writers)
        if done or not _reached(progress, when):
            return
        done.append(True)
        if "pause" in when:
            _pause(*when["pause"])
        elif "torn_batch" in when:
            _tear_next_batch(_open_file(progress.splits), when)
        else:
            _stop(when)

    run.save_progress = save_then_stop


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's dataflow, as `python -m dataflow` from its root imports
    _install(json.loads(sys.argv.pop(1)))
    from dataflow.cli import main

    sys.exit(main(sys.argv[1:]))
