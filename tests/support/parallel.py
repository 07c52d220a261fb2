"""The trainer's parallel layouts on CPU (gloo): a small GPT on the KJV, its settings at a fixed global batch, and
the one-process run every layout must reproduce."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from support import trainer as support


STEPS = 8


@pytest.fixture(scope="module")
def kjv_data(tmp_path_factory, kjv) -> pathlib.Path:
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    out = tmp_path_factory.mktemp("kjv-tp")
    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(out), shard_size="256KB", workers=1, progress=False))
    return out


def settings(data: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    """A 2-layer model on CPU in fp32; 256 tokens per optimizer step whatever the layout."""
    return [f"data.path={data}", "data.seq_len=32", "data.num_workers=0", "model.n_layer=2", "model.n_head=2",
            "model.d_model=32", f"train.steps={STEPS}", "train.warmup_steps=2", "train.lr=3e-3", "train.min_lr=3e-4",
            "train.precision=fp32", "train.device=cpu", "train.global_batch_tokens=256", "train.batch_check_every=1",
            f"checkpoint.dir={out / 'ck'}", "checkpoint.every=4", f"log.jsonl={out / 'metrics.jsonl'}",
            "log.every=1", *extra]


def run_cli(sets: list[str], nproc: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
    """The trainer on one thread per process (4 processes share 2 cores)."""
    return support.run_cli(sets, nproc, timeout, env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def baseline(kjv_data, tmp_path_factory) -> pathlib.Path:
    """One process, batch 8: the run every layout must reproduce."""
    out = tmp_path_factory.mktemp("tp-baseline")
    run_cli(settings(kjv_data, out, "data.batch_size=8"))
    return out
