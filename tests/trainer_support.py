"""Shared by the trainer's run tests: a small dataset of random byte-vocabulary tokens, and the settings of a
one-layer model on CPU whose steps take milliseconds."""

from __future__ import annotations

import pathlib

from conftest import write_random_dataset


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
