"""What a newcomer meets first: built-in configs by name, relative paths, a resumed run with nothing left to
do, and a run far beyond the machine that SIGTERM must still end."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from trainer.config import builtin_configs, load_config
from trainer.loop import train
from trainer.signals import SAME_REQUEST_S

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_builtin_configs_are_found_by_name_and_read_paths_against_the_working_directory(tmp_path, monkeypatch):
    assert {"demo", "gpt2-124m", "gpt-1b-fsdp", "gpt-7b-hsdp"} <= set(builtin_configs())
    monkeypatch.chdir(tmp_path)
    for spec in ("demo", "demo.toml", str(ROOT / "configs" / "demo.toml")):
        cfg = load_config(spec, ["data.path=mine/train"])
        assert cfg.checkpoint.dir == "demo-out/checkpoints" and cfg.data.path == "mine/train", spec
        assert cfg.model.n_layer == 3


def test_a_copied_config_reads_its_relative_paths_against_its_own_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project" / "configs"
    folder.mkdir(parents=True)
    (folder / "mine.toml").write_text((ROOT / "configs" / "demo.toml").read_text().replace(
        'path = ""', 'path = "../data/train"\nval_path = "s3://bucket/val"'))
    monkeypatch.chdir(tmp_path)  # run from elsewhere: the paths do not move
    cfg = load_config(str(folder / "mine.toml"), ["log.jsonl=here.jsonl"])
    assert cfg.data.path == str(tmp_path / "project" / "data" / "train")
    assert cfg.checkpoint.dir == str(folder / "demo-out" / "checkpoints")
    assert cfg.data.val_path == "s3://bucket/val"  # a URL is left alone
    assert cfg.checkpoint.resume == "auto"  # a keyword, not a path
    assert cfg.log.jsonl == "here.jsonl"  # --set values are the user's own, read against where they run


def test_an_unknown_config_names_the_built_in_ones(tmp_path):
    from trainer.__main__ import main

    with pytest.raises(Exception, match="built-in: .*demo"):
        load_config(str(tmp_path / "absent.toml"))
    assert main(["--config", "no-such-config"]) == 2


def test_a_run_resumed_at_its_last_step_says_how_to_train_on(tmp_path, capsys, kjv):
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(tmp_path / "data"), shard_size="1MB", workers=1,
                            progress=False))
    sets = [f"data.path={tmp_path / 'data'}", "data.seq_len=32", "data.batch_size=4", "data.num_workers=0",
            "model.n_layer=1", "model.n_head=2", "model.d_model=32", "train.steps=4", "train.warmup_steps=1",
            f"checkpoint.dir={tmp_path / 'ck'}", "checkpoint.every=2", "log.every=2", "log.jsonl="]
    assert train(load_config("demo", sets))["step"] == 4
    capsys.readouterr()
    assert train(load_config("demo", sets))["step"] == 4
    out = capsys.readouterr().out
    assert "nothing to do" in out and "--set train.steps=8" in out and "checkpoint.resume=none" in out
    assert "no steps measured" in out and "verdict" not in out
    assert train(load_config("demo", sets + ["train.steps=6"]))["step"] == 6  # the advice works


def _wait_for(path: pathlib.Path, text: str, proc: subprocess.Popen, seconds: float) -> str:
    """The content of `path` once it holds `text` (the process writes it); fails if the process ends first."""
    deadline = time.monotonic() + seconds
    while True:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        assert proc.poll() is None, f"the trainer ended ({proc.returncode}) before writing {text!r}: {content}"
        assert time.monotonic() < deadline, f"no {text!r} after {seconds:.0f} s: {content}"
        time.sleep(0.05)


def test_sigterm_ends_a_run_whose_step_is_far_beyond_the_machine(tmp_path, kjv):
    """One step would take many minutes: a warning says so before it starts; the first SIGTERM is answered at
    once (stop after this step), one sent again at once is its copy, one sent later ends the process at once."""
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(tmp_path / "data"), shard_size="4MB", workers=1,
                            progress=False))
    cmd = [sys.executable, "-m", "trainer", "--config", "demo", "--set", f"data.path={tmp_path / 'data'}",
           "--set", "data.seq_len=100000", "--set", "data.batch_size=1", "--set", "data.num_workers=1",
           "--set", f"checkpoint.dir={tmp_path / 'ck'}", "--set", "log.jsonl="]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as o, open(err, "w") as e:  # files, not pipes: nothing can block on a full pipe
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=o, stderr=e)
    try:
        warning = _wait_for(out, "warning:", proc, 240).split("warning:", 1)[1]
        assert "minutes" in warning and "data.seq_len (100000)" in warning, warning
        proc.send_signal(signal.SIGTERM)
        _wait_for(err, "stopping after the current step", proc, 60)  # answered mid-step
        answered = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # within SAME_REQUEST_S of the first: its copy (`timeout` sends two)
        time.sleep(max(0.0, SAME_REQUEST_S + 0.2 - (time.monotonic() - answered)))
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGTERM)  # later: a second request
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert "stopped at once" in err.read_text()
    finally:
        proc.kill()
        proc.wait()
    assert not os.path.exists(tmp_path / "ck") or not os.listdir(tmp_path / "ck")  # no step finished: no checkpoint


def test_dataflow_train_is_the_trainer(tmp_path, kjv):
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(tmp_path / "data"), shard_size="4MB", workers=1,
                            progress=False))
    run = [sys.executable, "-m", "dataflow", "train"]
    p = subprocess.run(run + ["--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage: dataflow train") and "demo" in p.stdout
    p = subprocess.run(run + ["--config", "demo", "--set", f"data.path={tmp_path / 'data'}", "--set", "train.steps=2",
                              "--set", "data.seq_len=32", "--set", "data.num_workers=0", "--set", "train.eval_every=0",
                              "--set", "log.every=1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step      2/2" in p.stdout and (tmp_path / "demo-out" / "checkpoints" / "step-000002").is_dir()
    p = subprocess.run(run + ["--config", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "data.path" in p.stderr


def test_the_step_estimate_warns_far_beyond_the_machine_and_is_quiet_for_the_demo(monkeypatch):
    import torch

    from trainer import estimate
    from trainer.model import GPT

    monkeypatch.setattr(estimate, "measured_flops", lambda device: 100e9)  # a fast CPU: 100 GFLOP/s
    said: list[str] = []
    for seq_len, batch, warned in ((128, 8, False), (100_000, 1, True)):
        cfg = load_config("demo", ["data.path=x", f"data.seq_len={seq_len}", f"data.batch_size={batch}"])
        with torch.device("meta"):
            gpt = GPT(cfg.model, 257, seq_len)
        said.clear()
        estimate.warn_if_out_of_reach(cfg, torch.device("cpu"), 1, gpt, seq_len * batch, said.append)
        assert bool(said) is warned, (seq_len, said)
    assert "minutes" in said[0] and "data.seq_len (100000)" in said[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, kjv):
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    data = tmp_path_factory.mktemp("tiny") / "data"
    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(data), shard_size="1MB", workers=1, progress=False))
    return [f"data.path={data}", "data.seq_len=32", "data.batch_size=4", "data.num_workers=0", "model.n_layer=1",
            "model.n_head=2", "model.d_model=32", "train.steps=4", "train.warmup_steps=1", "log.jsonl="]


@pytest.mark.parametrize("setting,said", [
    ("checkpoint.dir={file}/ck", "checkpoint.dir = '{file}/ck': cannot write checkpoints there"),
    ("log.jsonl={file}/m.jsonl", "log.jsonl = '{file}/m.jsonl': cannot write there"),
    ("train.beta2=1.5", "train.beta2 must be in [0, 1)"), ("train.eps=-1", "train.eps must be positive"),
    ("model.d_model=1000000", "does not fit in the memory of cpu")])
def test_a_setting_that_cannot_work_is_one_line_before_any_step(tmp_path, tiny, setting, said):
    # a checkpoint.dir under a file once failed at the first save, after the steps before it had run
    from dataflow.errors import ConfigError

    (tmp_path / "f").write_text("a file")
    sets = tiny + [setting.format(file=tmp_path / "f"), "log.tensorboard="]
    if "d_model" in setting:
        sets += ["model.n_layer=100", "model.n_head=2"]
    with pytest.raises(ConfigError) as e:
        train(load_config("demo", sets))
    assert said.format(file=tmp_path / "f") in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_checkpoint_is_one_line_naming_the_one_before(tmp_path, tiny):
    from dataflow.errors import FormatError

    sets = tiny + [f"checkpoint.dir={tmp_path / 'ck'}", "checkpoint.every=2", "checkpoint.keep=2"]
    assert train(load_config("demo", sets))["step"] == 4
    newest = tmp_path / "ck" / "step-000004"
    data = next(p for p in newest.iterdir() if p.suffix == ".distcp")
    os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(FormatError, match=r"step-000004: its tensors cannot be read .* the checkpoint is damaged: set "
                                          r"checkpoint.resume = \".*step-000002\" to start from the one before"):
        train(load_config("demo", sets + ["train.steps=6"]))


def test_a_loss_that_stays_at_a_new_level_stops_being_a_spike():
    # the running average only learnt from non-spike steps: a lasting rise (new data) was a spike for ever
    from types import SimpleNamespace

    from trainer.loop import SPIKE_PATIENCE, Counters, StepResult, guard, is_spike

    events = []
    run = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(spike_factor=3.0, spike_rollback=False,
                                                                    max_bad_steps=10)),
                          counters=Counters(), step=0, rolled_back_to=None, spikes_in_row=0,
                          log=SimpleNamespace(event=lambda step, kind, text, **_: events.append((step, kind))))
    for step, loss in enumerate([1.0] * 10 + [5.0] * 60):
        run.step = step
        spike = is_spike(loss, run.counters.loss_ema, 3.0)
        guard(run, StepResult(1e-3, loss, 1.0, True, spike, None, 0.0))
    spikes = [s for s, kind in events if kind == "spike"]
    assert sorted(set(spikes)) == list(range(10, 10 + SPIKE_PATIENCE))  # the last also takes 5.0 as the new level
    assert run.counters.loss_ema == pytest.approx(5.0)
