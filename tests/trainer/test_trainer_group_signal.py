"""One signal to the trainer's whole process group (a terminal's Ctrl-C, `timeout`, a scheduler's preemption) is
one stop request, also while loader workers run: the run finishes its step, saves a checkpoint there, exits 0,
and a resume continues from that checkpoint. Under torchrun the agent passes the signal on to each rank's group.

Every run waits for the trainer's own `step N/TOTAL` line before it signals: the signal lands while it trains.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from support.trainer import set_args, tiny_dataset, tiny_settings
from trainer.checkpoint import complete_checkpoints
from trainer.config import load_config
from trainer.loop import train
from trainer.signals import StopFlag

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> pathlib.Path:
    return tiny_dataset(tmp_path_factory.mktemp("group-signal") / "data", docs=200)


def settings(data: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    """A tiny model with two loader workers; it would train for ever, saving only when it stops."""
    return tiny_settings(data, out / "ck", "data.num_workers=2", "train.steps=100000", "train.warmup_steps=2",
                         "checkpoint.every=100000", f"log.jsonl={out / 'metrics.jsonl'}", "log.every=1", *extra)


def signal_group_while_training(cmd: list[str], sig: int, timeout: float = 240) -> tuple[int, str, str]:
    """Start `cmd` as its own process group, send `sig` to the group once the trainer prints a `step N/TOTAL`
    line, and return (exit code, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:  # the trainer flushes every console line
            seen.append(line)
            if line.startswith("step ") and "/100000 |" in line:
                os.killpg(proc.pid, sig)
                break
        else:
            raise AssertionError(f"the trainer ended ({proc.wait()}) before training: {''.join(seen)}"
                                 f"{proc.stderr.read()[-3000:]}")
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, "".join(seen) + out, err


def events(metrics: pathlib.Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("event") == kind]


def assert_stopped_with_a_checkpoint(out: pathlib.Path, stdout: str, stderr: str) -> int:
    """The run stopped once, after a step, and saved that step; returns the step."""
    assert "stopped at once" not in stderr, stderr[-3000:]
    (stop,) = events(out / "metrics.jsonl", "stop")
    step = stop["step"]
    assert [s for s, _ in complete_checkpoints(str(out / "ck"))] == [step]
    assert f"saved {out / 'ck' / f'step-{step:06d}'}" in stdout
    return step


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.heavy)],
                         ids=["SIGINT", "SIGTERM"])  # the same path twice: the second in make test-all
def test_one_signal_to_the_process_group_stops_with_a_checkpoint_and_exits_0(data, tmp_path, sig):
    cmd = [sys.executable, "-m", "trainer", "--config", "demo", *set_args(settings(data, tmp_path))]
    code, stdout, stderr = signal_group_while_training(cmd, sig)
    assert code == 0, stdout[-2000:] + stderr[-3000:]
    assert f"{signal.Signals(sig).name}: stopping after the current step" in stderr
    step = assert_stopped_with_a_checkpoint(tmp_path, stdout, stderr)
    # the checkpoint is the run's: training on resumes from it
    result = train(load_config("demo", settings(data, tmp_path, f"train.steps={step + 2}", "data.num_workers=0")))
    assert result["step"] == step + 2 and result["resumed_from"] == str(tmp_path / "ck" / f"step-{step:06d}")


@pytest.mark.heavy  # torchrun with two processes on gloo, each with two loader workers (make test-all)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_torchrun_stops_every_rank_with_a_checkpoint(data, tmp_path, sig):
    """torchrun's agent passes the signal to each rank's process group (rank and loader workers): one signal."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", "--config", "demo", *set_args(settings(data, tmp_path, "data.batch_size=2"))]
    code, stdout, stderr = signal_group_while_training(cmd, sig, timeout=300)
    assert "forcefully exiting" not in stderr, stderr[-3000:]  # every rank left inside the agent's grace period
    step = assert_stopped_with_a_checkpoint(tmp_path, stdout, stderr)
    assert len(list((tmp_path / "ck" / f"step-{step:06d}").glob("rng-rank*.json"))) == 2
    assert "data path:" in stdout  # rank 0 finished the run: its summary lines
    result = train(load_config("demo", settings(data, tmp_path, f"train.steps={step + 2}", "data.num_workers=0",
                                                "data.batch_size=4")))
    assert result["step"] == step + 2 and result["resumed_from"].endswith(f"step-{step:06d}")


def _report_signal_state(conn) -> None:
    """In a forked child: its wakeup fd and stop handlers, and that SIGINT and SIGTERM leave it running."""
    fd = signal.set_wakeup_fd(-1)
    handlers = [signal.getsignal(s).__name__ for s in (signal.SIGINT, signal.SIGTERM)]
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(os.getpid(), sig)
    conn.send((fd, handlers))


def test_a_child_forked_while_the_trainer_stops_on_signals_keeps_none_of_it():
    """A loader worker forked from the trainer does not pass its copy of a group signal into the trainer's wakeup
    pipe (one signal counted as two or three), and survives it to serve the last step's batches."""
    flag = StopFlag(announce=False)
    try:
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_report_signal_state, args=(send,))
        child.start()
        fd, handlers = recv.recv()
        child.join(30)
    finally:
        flag.restore()
    assert fd == -1, "the child kept the trainer's wakeup fd"
    assert handlers == ["_ignore", "_ignore"] and child.exitcode == 0
    assert not flag.set
