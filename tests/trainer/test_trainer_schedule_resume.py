"""Training on from a checkpoint with another schedule: a longer run (train.steps raised) goes on at the learning
rate the checkpoint's run had and decays over the new remainder, instead of re-stretching the whole schedule (a
jump from 3e-4 to 1.46e-3 at the resume step); any other change of the schedule is one console line saying it."""

from __future__ import annotations

import json
import pathlib

import pytest

from support.trainer import tiny_dataset, tiny_settings
from trainer.config import TrainConfig, load_config
from trainer.loop import train
from trainer.optim import Schedule, lr_at

LR, MIN_LR, WARMUP = 3e-3, 3e-4, 2


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> pathlib.Path:
    return tiny_dataset(tmp_path_factory.mktemp("schedule") / "data", seed=7)


def run(data: pathlib.Path, out: pathlib.Path, log: str, *extra: str) -> dict[int, float]:
    """Train a tiny model (checkpoints in out/ck every 2 steps) and return the lr of each step it trained."""
    train(load_config("demo", tiny_settings(
        data, out / "ck", f"train.lr={LR}", f"train.min_lr={MIN_LR}", f"train.warmup_steps={WARMUP}",
        "checkpoint.every=2", "checkpoint.keep=5", f"log.jsonl={out / log}", "log.every=1", *extra)))
    return {r["step"]: r["lr"] for r in map(json.loads, (out / log).read_text().splitlines()) if "lr" in r}


def old_lr(step: int, decay: str = "cosine") -> float:
    """The learning rate the checkpoint's run (train.steps = 10) has at `step`."""
    return lr_at(step, TrainConfig(steps=10, lr=LR, min_lr=MIN_LR, warmup_steps=WARMUP, decay=decay))


def saved_schedule(out: pathlib.Path, step: int) -> Schedule:
    return Schedule.saved(json.loads((out / "ck" / f"step-{step:06d}" / "trainer_state.json").read_text()))


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_a_longer_run_goes_on_at_the_learning_rate_of_its_resume_step(data, tmp_path, capsys, decay):
    first = run(data, tmp_path, "a.jsonl", "train.steps=10", "train.stop_at=6", f"train.decay={decay}")
    assert sorted(first) == list(range(1, 7)) and first[6] == pytest.approx(old_lr(6, decay), rel=1e-12)
    capsys.readouterr()
    later = run(data, tmp_path, "b.jsonl", "train.steps=20", f"train.decay={decay}")
    out = capsys.readouterr().out
    assert "schedule: train.steps 10 -> 20 since the checkpoint" in out and f"{first[6]:.2e} at step 6" in out
    assert sorted(later) == list(range(7, 21))
    # the schedule the run trained on, as its checkpoints record it: at the resume step, the old run's lr
    assert saved_schedule(tmp_path, 20).at(6) == pytest.approx(first[6], rel=1e-12)
    # ... and from there down to min_lr at the new end, without a jump
    lrs = [first[6]] + [later[s] for s in range(7, 21)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and later[20] == pytest.approx(MIN_LR)
    assert later[7] > first[6] * 0.9  # the decay is spread over the 14 steps left, not 4


def test_training_on_from_the_end_stays_at_min_lr(data, tmp_path):
    """The README's "train on from the demo's checkpoint": the schedule had ended at min_lr, so it stays there
    (it jumped back to half the peak)."""
    first = run(data, tmp_path, "a.jsonl", "train.steps=10")
    assert first[10] == pytest.approx(MIN_LR)
    later = run(data, tmp_path, "b.jsonl", "train.steps=16")
    assert [later[s] for s in range(11, 17)] == pytest.approx([MIN_LR] * 6, rel=1e-12)
    # trained on again, further still: it stays there
    assert run(data, tmp_path, "c.jsonl", "train.steps=18") == pytest.approx({17: MIN_LR, 18: MIN_LR}, rel=1e-12)


def test_a_checkpoint_from_before_the_schedule_record_still_goes_on_continuously(data, tmp_path):
    run(data, tmp_path, "a.jsonl", "train.steps=10", "train.stop_at=6")
    state_file = tmp_path / "ck" / "step-000006" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["scheduler"] = {k: state["scheduler"][k] for k in ("decay", "step", "lr")}  # what was saved before
    state_file.write_text(json.dumps(state))
    later = run(data, tmp_path, "b.jsonl", "train.steps=20")
    assert old_lr(6) >= later[7] > old_lr(7)
    assert saved_schedule(tmp_path, 20).at(6) == pytest.approx(old_lr(6), rel=1e-12)


def test_another_peak_learning_rate_on_resume_is_said_in_one_line(data, tmp_path, capsys):
    run(data, tmp_path, "a.jsonl", "train.steps=10", "train.stop_at=6")
    capsys.readouterr()
    later = run(data, tmp_path, "b.jsonl", "train.steps=10", "train.lr=1e-3")
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("schedule:")]
    new = lr_at(7, TrainConfig(steps=10, lr=1e-3, min_lr=MIN_LR, warmup_steps=WARMUP))
    assert "train.lr 0.003 -> 0.001" in line and f"{new:.2e} at step 7" in line and f"{old_lr(7):.2e}" in line
    assert later[7] == pytest.approx(new, rel=1e-12)  # the user's new setting applies, said


def test_an_unchanged_schedule_is_the_same_schedule(data, tmp_path, capsys):
    whole = run(data, tmp_path / "whole", "a.jsonl", "train.steps=10")
    run(data, tmp_path / "cut", "a.jsonl", "train.steps=10", "train.stop_at=5")
    capsys.readouterr()
    rest = run(data, tmp_path / "cut", "b.jsonl", "train.steps=10")
    assert "schedule:" not in capsys.readouterr().out
    assert all(rest[s] == whole[s] for s in range(6, 11))  # bitwise
