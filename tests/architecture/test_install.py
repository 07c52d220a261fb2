"""A user's first hour, for real: a non-editable install into a fresh virtual environment, in an empty folder
with nothing of this repository beside it, tokenizes a small JSONL and trains on it with a built-in config."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sh(cmd: list[str], cwd: pathlib.Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.heavy
def test_a_wheel_in_a_fresh_venv_tokenizes_and_trains_from_an_empty_folder(tmp_path):
    import torch

    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
        str(ROOT)], cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("dataflow_lm-*.whl")
    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = str(venv / "bin" / "python")
    sh([py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"], cwd=tmp_path)
    sh([py, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)
    work = tmp_path / "empty"
    work.mkdir()
    with open(work / "notes.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": f"Note {i}: the quick brown fox jumps over the lazy dog {i % 7} times."})
                    + "\n")
    dataflow = str(venv / "bin" / "dataflow")
    sh([dataflow, "tokenize", "notes.jsonl", "-o", "data", "--no-progress"], cwd=work)
    out = sh([dataflow, "train", "--config", "demo", "--set", "data.path=data", "--set", "train.steps=4",
              "--set", "data.seq_len=32", "--set", "train.eval_every=0"], cwd=work)
    assert "step      4/4" in out.stdout, out.stdout
    assert (work / "demo-out" / "checkpoints").is_dir()  # the built-in config's paths: read against the cwd
