"""A run owns its checkpoint folder: a new run refuses another run's checkpoints there unless told to replace
them, pruning never deletes the run's own newest checkpoints for an older run's, and a resume never continues
another run (or another history of the same run) silently. Checkpoints written before run ids still resume."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from support.trainer import set_args, tiny_dataset, tiny_settings
from dataflow.errors import ConfigError
from trainer.__main__ import main
from trainer.checkpoint import STATE_FILE, complete_checkpoints
from trainer.config import load_config
from trainer.loop import train

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> pathlib.Path:
    return tiny_dataset(tmp_path_factory.mktemp("runs") / "data")


def settings(data: pathlib.Path, ck: pathlib.Path, *extra: str) -> list[str]:
    """A tiny model, a checkpoint every 2 steps, the newest 2 kept."""
    return tiny_settings(data, ck, "train.warmup_steps=1", "checkpoint.every=2", "checkpoint.keep=2", "log.jsonl=",
                         *extra)


def run(data: pathlib.Path, ck: pathlib.Path, *extra: str) -> dict:
    return train(load_config("demo", settings(data, ck, *extra)))


def run_ids(ck: pathlib.Path) -> dict[int, str | None]:
    """step -> the run id in each complete checkpoint of `ck`."""
    return {step: json.loads((pathlib.Path(path) / STATE_FILE).read_text()).get("run_id")
            for step, path in complete_checkpoints(str(ck))}


@pytest.fixture
def old_run(data, tmp_path) -> pathlib.Path:
    """A finished run of 6 steps: its checkpoints 4 and 6 in tmp_path/ck."""
    ck = tmp_path / "ck"
    run(data, ck, "train.steps=6")
    assert sorted(run_ids(ck)) == [4, 6]
    return ck


def test_a_new_run_into_another_runs_folder_is_refused_in_one_line(data, old_run, capsys):
    before = run_ids(old_run)
    sets = settings(data, old_run, "train.steps=4", "checkpoint.resume=none")
    assert main(["--config", "demo", *set_args(sets)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(old_run) in err, err
    assert "step-000004" in err and "step-000006" in err  # what is there
    assert 'checkpoint.resume = "auto"' in err and "checkpoint.replace = true" in err  # what to do
    assert run_ids(old_run) == before  # nothing deleted, nothing written


def test_a_replacing_run_owns_the_folder_and_its_resume_continues_it(data, old_run, capsys):
    """The issue's case: pruning kept the highest steps (the old run's 6) and deleted the new run's own."""
    (old_id,) = set(run_ids(old_run).values())
    run(data, old_run, "train.steps=4", "checkpoint.resume=none", "checkpoint.replace=true")
    assert "deleted another run's checkpoints in" in capsys.readouterr().out
    ids = run_ids(old_run)
    assert sorted(ids) == [2, 4] and len(set(ids.values())) == 1 and old_id not in ids.values()
    result = run(data, old_run, "train.steps=6")  # resume = "auto": the new run, from its step 4
    assert result["resumed_from"] == str(old_run / "step-000004") and result["step"] == 6
    assert set(run_ids(old_run).values()) == set(ids.values())  # the same run, trained on


def test_a_resume_from_an_earlier_checkpoint_leaves_no_later_history_behind(data, old_run):
    """Training on from step 4 while step 6 exists makes two histories of one run: refused, or replaced."""
    earlier = str(old_run / "step-000004")
    with pytest.raises(ConfigError, match=r"step-000006.* later than .*step-000004.*checkpoint\.replace = true"):
        run(data, old_run, "train.steps=8", f"checkpoint.resume={earlier}")
    assert sorted(run_ids(old_run)) == [4, 6]
    result = run(data, old_run, "train.steps=8", f"checkpoint.resume={earlier}", "checkpoint.replace=true")
    assert result["resumed_from"] == earlier and result["step"] == 8
    assert sorted(run_ids(old_run)) == [6, 8]  # step 6 of the new history, pruned by the run's own saves


def test_auto_resume_in_a_folder_holding_two_runs_is_refused(data, old_run, tmp_path):
    other = tmp_path / "other"
    run(data, other, "train.steps=8")
    shutil.copytree(other / "step-000008", old_run / "step-000008")  # another run's newer checkpoint
    with pytest.raises(ConfigError, match=r"another run .*step-000004, step-000006"):
        run(data, old_run, "train.steps=10")


def test_checkpoints_from_before_run_ids_still_resume_and_stay_one_run(data, old_run):
    for _, path in complete_checkpoints(str(old_run)):  # as the trainer wrote them before run ids
        state_file = pathlib.Path(path) / STATE_FILE
        state = json.loads(state_file.read_text())
        del state["run_id"]
        state_file.write_text(json.dumps(state))
    result = run(data, old_run, "train.steps=8")
    assert result["resumed_from"] == str(old_run / "step-000006") and result["step"] == 8
    assert run_ids(old_run) == {6: None, 8: None}  # still the one run: its next resume is not refused
    assert run(data, old_run, "train.steps=10")["step"] == 10
    with pytest.raises(ConfigError, match="another run"):  # ... and a new run cannot mix with it
        run(data, old_run, "train.steps=2", "checkpoint.resume=none")


@pytest.mark.heavy  # the whole demo twice: tokenize and train (make test-all)
def test_make_demo_twice_keeps_the_second_runs_checkpoints(tmp_path):
    demo = [sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path / "demo"), "--documents", "400"]
    subprocess.run(demo, cwd=ROOT, check=True, capture_output=True, timeout=900)  # 60 steps: checkpoints 30, 60
    ck = tmp_path / "demo" / "checkpoints"
    first = run_ids(ck)
    assert sorted(first) == [30, 60]
    subprocess.run(demo + ["--steps", "40"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    second = run_ids(ck)
    assert sorted(second) == [30, 40] and not set(second.values()) & set(first.values())


@pytest.mark.heavy  # two processes on gloo (make test-all)
def test_a_replacing_run_under_torchrun_deletes_once_and_every_rank_starts_after(data, old_run):
    sets = settings(data, old_run, "train.steps=4", "data.batch_size=2", "checkpoint.resume=none",
                    "checkpoint.replace=true")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "trainer",
           "--config", "demo", *set_args(sets)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("deleted another run's checkpoints") == 1  # said once, by the main rank
    ids = run_ids(old_run)
    assert sorted(ids) == [2, 4] and len(set(ids.values())) == 1
