"""Shared by the trainer's run tests: a small dataset of random byte-vocabulary tokens, and the settings of a
one-layer model on CPU whose steps take milliseconds."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from support.data import write_random_dataset

from support.paths import ROOT  # noqa: E402


def tiny_dataset(folder: pathlib.Path, docs: int = 60, seed: int = 5) -> pathlib.Path:
    return pathlib.Path(write_random_dataset(folder, docs=docs, seed=seed, min_len=100, max_len=600))


def tiny_settings(data: pathlib.Path, ck: pathlib.Path, *extra: str) -> list[str]:
    """`--set` values of a tiny run on `data` with checkpoints in `ck`; `extra` come last (and win)."""
    return [f"data.path={data}", "data.seq_len=32", "data.batch_size=4", "data.num_workers=0", "model.n_layer=1",
            "model.n_head=2", "model.d_model=32", "train.precision=fp32", "train.device=cpu", "train.eval_every=0",
            f"checkpoint.dir={ck}", *extra]


def set_args(sets: list[str]) -> list[str]:
    """`--set A --set B ...` for a trainer command line."""
    return [arg for s in sets for arg in ("--set", s)]


def run_cli(sets: list[str], nproc: int = 1, timeout: float = 300, config: str = "demo",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m trainer --config CONFIG` in a new process, or under torchrun with `nproc` processes on gloo;
    `env`: variables set on top of this process's. Fails the test, with the run's output, unless it exits 0."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] \
        if nproc > 1 else [sys.executable]
    cmd = launch + ["-m", "trainer", "--config", config, *set_args(sets)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def records(path: pathlib.Path) -> list[dict]:
    """The JSON records of a log.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(path: pathlib.Path) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad_norm) of every training record."""
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records(path) if "loss" in r}


def assert_close(a: dict, b: dict, steps: range, rtol: float = 1e-4) -> None:
    """Two runs' losses (within rtol) and grad norms (within 10 rtol) agree at every step of `steps`."""
    assert set(steps) <= set(a), sorted(a)
    for s in steps:
        assert a[s][0] == pytest.approx(b[s][0], rel=rtol), f"loss at step {s}"
        assert a[s][1] == pytest.approx(b[s][1], rel=10 * rtol), f"grad norm at step {s}"
