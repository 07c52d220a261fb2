"""`inspect`/`verify`/`decode` on a folder that `dataflow tokenize` is still writing, or that a killed run left,
say so (and what to do) instead of "no manifest here"."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from support import kill_points
from support.data import KJV
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`
from dataflow.formats.manifest import TOKENIZE_WORK_DIR
from dataflow.preprocess.layout import WORK_DIR


def dataflow(*args: str) -> subprocess.CompletedProcess:
    return run_dataflow(*args, timeout=120)


def test_the_formats_layer_names_tokenize_work_folder_as_tokenize_does():
    assert TOKENIZE_WORK_DIR == WORK_DIR


@pytest.mark.parametrize("val", [False, True])
def test_a_folder_being_written_then_interrupted_says_so(tmp_path, val):
    out = tmp_path / "out"
    args = ["tokenize", str(KJV), "-o", str(out), "--tokenizer", "bytes", "--workers", "1", "--no-progress",
            "--shard-size", "256KB"] + (["--val-fraction", "0.1"] if val else [])
    paused, go = tmp_path / "paused", tmp_path / "go"
    first = subprocess.Popen(kill_points.command({"pause": [str(paused), str(go)]}, *args),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = out / "train" if val else out
    try:
        deadline = time.monotonic() + 300
        while not paused.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
            time.sleep(0.02)
        for command in ("inspect", "verify", "decode"):
            p = dataflow(command, str(target))
            assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
            assert "is writing it now" in p.stderr and "no manifest here" not in p.stderr, p.stderr
    finally:
        first.kill()
        first.wait()
    p = dataflow("inspect", str(target))  # killed: nobody holds the lock, the work is left
    assert p.returncode == 2 and "stopped before the end; rerun the same command" in p.stderr, p.stderr
    assert subprocess.run([sys.executable, "-m", "dataflow", *args], capture_output=True, timeout=300).returncode == 0
    assert dataflow("verify", str(target)).returncode == 0
