"""Framework recipes, proven by those projects' own code: Lightning, Accelerate, torch.distributed.checkpoint.

Each run trains on a dataset whose windows are all distinct, stops after a checkpoint taken mid-epoch
(with a crash a few batches later: what was trained after the checkpoint is lost, as after a real
failure), resumes from the checkpoint in a fresh loader, and checks that every sample of the epoch was
trained on exactly once across the stop. docs/frameworks.md shows the same recipes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from dataflow import DevicePrefetcher, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta

COUNTING = TokenizerMeta(kind="hf", name="counting", vocab_size=65536, eos_id=65535)
SEQ, BATCH, SEED = 16, 4, 5
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """Tokens counting up through the corpus, in documents of random lengths over several shards."""
    out = tmp_path_factory.mktemp("frameworks") / "counting"
    rng = np.random.default_rng(0)
    stream = np.arange(6_000)
    with ShardWriter(str(out), tokenizer_meta=COUNTING, shard_size="2KB") as w:
        for doc in np.split(stream, np.sort(rng.choice(np.arange(1, len(stream)), size=60, replace=False))):
            w.write(doc)
    return str(out)


def loader(data: str, workers: int = 0) -> StreamingDataLoader:
    return StreamingDataLoader(StreamingDataset(data, seq_len=SEQ, seed=SEED), batch_size=BATCH, num_workers=workers)


def rows(batch: dict) -> list[int]:
    """The first token of each window of a batch: it names the window (the tokens count up)."""
    return batch["input_ids"][:, 0].tolist()


def epoch_rows(data: str) -> list[int]:
    """Every window of one epoch, in the order an uninterrupted run trains on them."""
    return [r for b in loader(data) for r in rows(b)]


def assert_each_once(trained: list[int], data: str) -> None:
    everything = epoch_rows(data)
    assert len(everything) == len(set(everything)) > 100
    assert sorted(trained) == sorted(everything), "some samples trained twice or never"
    assert trained == everything  # and in the order an uninterrupted run takes


class Crash(Exception):
    """Stands for a node failure after the checkpoint."""


# --- Lightning --------------------------------------------------------------------------------------------

def _lightning_module(crash_at: int | None):
    import lightning.pytorch as pl

    class Recorder(pl.LightningModule):
        """Records the windows of each optimizer step; crashes at step `crash_at`."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            if crash_at is not None and self.global_step == crash_at:
                raise Crash(f"step {crash_at}")
            self.seen[self.global_step] = rows(batch)
            return self.layer(batch["input_ids"][:, :1].float()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Recorder()


def _trainer(tmp_path: pathlib.Path, every: int | None = None):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=every, save_top_k=-1)] if every else []
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=bool(every), callbacks=callbacks,
                      num_sanity_val_steps=0, default_root_dir=tmp_path)


def test_lightning_fit_resumes_mid_epoch_from_ckpt_path_with_two_workers(data, tmp_path):
    every, crash_at = 7, 10
    first = _lightning_module(crash_at)
    with pytest.raises(Crash):
        _trainer(tmp_path, every).fit(first, train_dataloaders=loader(data, workers=2))
    ckpt = tmp_path / f"epoch=0-step={every}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(tmp_path))

    second = _lightning_module(None)
    _trainer(tmp_path).fit(second, train_dataloaders=loader(data, workers=2), ckpt_path=str(ckpt))
    assert min(second.seen) == every
    assert [first.seen[s] for s in range(every, crash_at)] == [second.seen[s] for s in range(every, crash_at)]
    trained = [r for s in range(every) for r in first.seen[s]] + \
        [r for s in sorted(second.seen) for r in second.seen[s]]
    assert_each_once(trained, data)


DDP_SCRIPT = r'''
import json, sys
import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from dataflow import StreamingDataLoader, StreamingDataset

data, out, phase, ckpt = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
EVERY, CRASH = 5, 8

class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen = {}

    def train_dataloader(self):  # built after the process group exists: rank and world size come from it
        ds = StreamingDataset(data, seq_len=%(seq)d, seed=%(seed)d)
        return StreamingDataLoader(ds, batch_size=%(batch)d, num_workers=1)

    def training_step(self, batch, batch_idx):
        if phase == "first" and self.global_step == CRASH:
            self.dump()
            raise SystemExit(3)
        self.seen[self.global_step] = batch["input_ids"][:, 0].tolist()
        return self.layer(batch["input_ids"][:, :1].float()).sum()

    def dump(self):
        with open(f"{out}/{phase}-rank{self.global_rank}.json", "w") as f:
            json.dump(self.seen, f)

    def on_train_end(self):
        self.dump()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

callbacks = [ModelCheckpoint(dirpath=out, every_n_train_steps=EVERY, save_top_k=-1)] if phase == "first" else []
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                     enable_checkpointing=phase == "first", num_sanity_val_steps=0, default_root_dir=out)
trainer.fit(Recorder(), ckpt_path=None if ckpt == "-" else ckpt)
'''


@pytest.mark.heavy
def test_lightning_ddp_two_processes_on_gloo_resume_every_sample_once(data, tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_SCRIPT % {"seq": SEQ, "seed": SEED, "batch": BATCH})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PL_TORCH_DISTRIBUTED_BACKEND": "gloo"}

    def run(phase: str, ckpt: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), data, str(tmp_path), phase, ckpt], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=240)

    first = run("first", "-")
    ckpt = tmp_path / "epoch=0-step=5.ckpt"
    assert first.returncode != 0 and ckpt.exists(), first.stderr[-3000:]
    second = run("second", str(ckpt))
    assert second.returncode == 0, second.stderr[-3000:]
    trained = []
    for rank in (0, 1):
        before = json.loads((tmp_path / f"first-rank{rank}.json").read_text())
        after = json.loads((tmp_path / f"second-rank{rank}.json").read_text())
        assert min(map(int, after)) == 5
        trained += [r for s in range(5) for r in before[str(s)]] + [r for rs in after.values() for r in rs]
    everything = epoch_rows(data)
    assert len(trained) == len(set(trained))  # nothing twice, on any rank
    assert set(everything) - set(trained) <= set(everything[-2 * BATCH:])  # only the uneven tail is dropped
    assert len(trained) == 2 * BATCH * (len(everything) // (2 * BATCH))


# --- Accelerate --------------------------------------------------------------------------------------------

def test_accelerate_register_for_checkpointing_save_and_load_state(data, tmp_path):
    from accelerate import Accelerator

    stop, lost = 9, 3
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    model, opt, dl = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), loader(data, workers=2))
    acc.register_for_checkpointing(dl)
    trained, it = [], iter(dl)
    for _ in range(stop):
        batch = next(it)
        acc.backward(model(batch["input_ids"][:, :1].float()).sum())
        opt.step()
        opt.zero_grad()
        trained += rows(batch)
    acc.save_state(str(tmp_path / "state"))
    for _ in range(lost):  # trained after the checkpoint, then lost in the crash
        next(it)
    dl.close()

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    model, _, dl = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), loader(data, workers=1))
    acc.register_for_checkpointing(dl)
    acc.load_state(str(tmp_path / "state"))
    trained += [r for b in dl for r in rows(b)]
    assert_each_once(trained, data)


# --- torch.distributed.checkpoint (the way torchtitan checkpoints its dataloader) --------------------------

@pytest.mark.parametrize("wrap", ["loader", "prefetcher"])
def test_dcp_save_and_load_with_the_loader_as_a_stateful(data, tmp_path, wrap):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.stateful import Stateful

    def make(workers: int):
        dl = loader(data, workers=workers)
        return dl if wrap == "loader" else DevicePrefetcher(dl, device="cpu", depth=3)

    stop, lost = 11, 4
    model = torch.nn.Linear(2, 2)
    source = make(2)
    assert isinstance(source, Stateful)  # torch's own protocol: state_dict() and load_state_dict()
    trained, it = [], iter(source)
    for _ in range(stop):
        trained += rows(next(it))
    dcp.save({"model": model.state_dict(), "dataloader": source}, checkpoint_id=str(tmp_path / "step-11"))
    for _ in range(lost):
        next(it)
    source.close()

    fresh_model, resumed = torch.nn.Linear(2, 2), make(1)
    state = {"model": fresh_model.state_dict(), "dataloader": resumed}
    dcp.load(state, checkpoint_id=str(tmp_path / "step-11"))
    fresh_model.load_state_dict(state["model"])
    assert torch.equal(fresh_model.weight, model.weight)
    trained += [r for b in resumed for r in rows(b)]
    assert_each_once(trained, data)
