"""The trainer's data order is audited and its ranks' figures kept (`data.audit`, `log.run_dir`): a run stopped
and resumed from its checkpoint serves every sample once, a resume from an older checkpoint is named, and under
torchrun rank 0 sums up the fleet."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from support.trainer import set_args, tiny_dataset, tiny_settings
from dataflow.audit.replay import audit_folder
from trainer.checkpoint import complete_checkpoints
from trainer.config import load_config
from trainer.loop import train

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> pathlib.Path:
    return tiny_dataset(tmp_path_factory.mktemp("audited") / "data")


def settings(data: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return tiny_settings(data, out / "ck", "train.warmup_steps=1", "checkpoint.every=4", "checkpoint.keep=3",
                         f"data.audit={out / 'audit'}", f"log.jsonl={out / 'log.jsonl'}", *extra)


def test_a_run_stopped_and_resumed_from_its_checkpoint_serves_every_sample_once(data, tmp_path):
    train(load_config("demo", settings(data, tmp_path, "train.steps=12", "train.stop_at=8")))
    train(load_config("demo", settings(data, tmp_path, "train.steps=12", "checkpoint.resume=auto")))
    report = audit_folder(str(tmp_path / "audit"))
    assert report["clean"], report["findings"]
    assert report["samples"] == 12 * 4  # 12 steps of 4 samples, each once: the prefetcher's read-ahead is not served
    assert [p.name for p in (tmp_path / "ranks").iterdir()] == ["rank-0.jsonl"]  # beside log.jsonl: the fleet of 1


def test_a_resume_from_an_older_checkpoint_is_named_by_the_audit(data, tmp_path):
    train(load_config("demo", settings(data, tmp_path, "train.steps=12", "train.stop_at=8")))
    newest = dict(complete_checkpoints(str(tmp_path / "ck")))[8]
    shutil.rmtree(newest)  # the newest is lost: the run goes on from step 4
    train(load_config("demo", settings(data, tmp_path, "train.steps=12", "checkpoint.resume=auto")))
    report = audit_folder(str(tmp_path / "audit"))
    (finding,) = report["findings"]
    assert (finding["kind"], finding["start"], finding["stop"]) == ("duplicate", 16, 32)  # steps 5-8, again


@pytest.mark.heavy
def test_under_torchrun_each_rank_keeps_its_figures_and_rank_0_sums_up_the_fleet(data, tmp_path):
    sets = settings(data, tmp_path, "train.steps=8", "train.parallel=ddp", "log.every=2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "trainer", "--config", "demo", *set_args(sets)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fleet of 2 ranks" in proc.stdout, proc.stdout
    assert sorted(p.name for p in (tmp_path / "ranks").iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    report = audit_folder(str(tmp_path / "audit"))
    assert report["clean"] and report["samples"] == 8 * 4 * 2, report
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])["event"] == "layout"
