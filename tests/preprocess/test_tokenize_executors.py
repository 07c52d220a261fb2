"""Executors own their workers: started on entry, killed at once when the block raises (an error, Ctrl-C),
nothing left running; and the start's slow checks overlap the workers' first bundles, committing nothing
before they pass."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.errors import ConfigError
from dataflow.preprocess import executors, startup
from dataflow.preprocess.plan import bundle_units, file_sizes, plan_units
from dataflow.preprocess.run import TokenizeConfig, tokenize
from dataflow.tokenizers.load import load_tokenizer
from dataflow.preprocess.worker import UnitSpec
from support.cli import dataset_bytes


def _wait_for(path: Path, what: str, seconds: float = 120) -> None:
    """Until `path` exists (a state of the run, never a moment); fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def _hold(bundle, spec, scratch):
    """A bundle that never ends (as a long one would), after saying so."""
    Path(scratch, f"holding-{os.getpid()}").touch()
    while True:
        time.sleep(1)


def _bundles(src: Path, unit_bytes: int = 64 << 10) -> list:
    files = [str(src)]
    return bundle_units(plan_units(files, unit_bytes, file_sizes(files), {files[0]: src.name}), unit_bytes)


def _spec() -> UnitSpec:
    return UnitSpec("bytes", "auto", "text", "id", 256, load_tokenizer("bytes").meta)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"text": "document {i} {"x" * 500}"}}\n' for i in range(1000)))
    return path


def test_the_pool_yields_in_order_and_leaves_no_process(src, tmp_path):
    with executors.LocalPoolExecutor(2, "bytes", "auto") as ex:
        ex.submit(iter(_bundles(src)), _spec(), str(tmp_path / "scratch"))
        results = list(ex.results())
    assert [r.unit.index for r in results] == sorted(r.unit.index for r in results) and len(results) > 4
    assert multiprocessing.active_children() == []


@pytest.mark.timing  # "at once" is a wall-clock bound (2 s): a loaded machine may pass it
@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_the_block_kills_the_pool_at_once(src, tmp_path, monkeypatch, workers):
    """Workers in the middle of bundles that would never end: leaving the block by an exception kills them
    at once (not after their bundles), and no process is left."""
    monkeypatch.setattr(executors, "tokenize_bundle", _hold)  # forked workers inherit it
    scratch = tmp_path / "scratch"
    with pytest.raises(RuntimeError, match="stop"):
        with executors.LocalPoolExecutor(workers, "bytes", "auto") as ex:
            ex.submit(iter(_bundles(src)), _spec(), str(scratch))
            deadline = time.monotonic() + 120
            while len(list(scratch.glob("holding-*"))) < workers:
                assert time.monotonic() < deadline, "the workers never started their bundles"
                time.sleep(0.02)
            assert len(multiprocessing.active_children()) == workers
            stopped = time.monotonic()
            raise RuntimeError("stop")
    assert time.monotonic() - stopped < 2
    assert multiprocessing.active_children() == []


def test_the_in_process_executor_gives_the_same_bytes(src, tmp_path):
    for executor, out in (("inprocess", "a"), ("local", "b")):
        tokenize(TokenizeConfig(inputs=[str(src)], out=str(tmp_path / out), unit_bytes=64 << 10, workers=2,
                                executor=executor, shard_size="64KB", val_fraction=0.2, progress=False))
    assert dataset_bytes(tmp_path / "a") == dataset_bytes(tmp_path / "b")
    assert len(list((tmp_path / "a" / "train").glob("shard-*"))) > 4


def test_an_unknown_executor_is_refused_before_anything_is_made(src, tmp_path):
    with pytest.raises(ConfigError, match="--executor 'dask': unknown; choose local or ray"):
        tokenize(TokenizeConfig(inputs=[str(src)], out=str(tmp_path / "out"), executor="dask", progress=False))
    assert not (tmp_path / "out").exists()


def test_a_failing_sample_check_with_workers_already_working_leaves_nothing(src, tmp_path, monkeypatch, capsys):
    """The workers tokenize their first bundles while this process checks the tokenizer on the input: a check
    that fails then is still one line, and leaves no shard, journal or folder behind, and no worker."""
    out = tmp_path / "out"

    def failing_check(cfg, tok, units):
        # the workers have started: a finished shard of theirs is in the scratch folder, uncommitted
        deadline = time.monotonic() + 120
        while not list((out / "_work").glob("task-*/units/unit-*")):
            assert time.monotonic() < deadline, "the workers did not start before the checks ended"
            time.sleep(0.02)
        raise ConfigError(f"{GPT2_JSON}: --engine gigatoken gives other ids than tokenizers: on the input sample")

    monkeypatch.setattr(startup, "check_on_input", failing_check)
    capsys.readouterr()
    code = main(["tokenize", str(src), "-o", str(out), "--tokenizer", str(GPT2_JSON), "--unit-size", "64KB",
                 "--workers", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "gives other ids than tokenizers" in err, err
    assert not out.exists() or list(out.rglob("*")) == [], list(out.rglob("*"))
    assert multiprocessing.active_children() == []


def test_when_the_checks_settle_on_tokenizers_the_workers_start_again(src, tmp_path, monkeypatch):
    """The workers began with the engine asked for (auto); the checks here chose tokenizers itself: what they
    made is dropped and redone, and the bytes are those of a run on --engine hf."""
    monkeypatch.setattr(startup, "check_on_input", lambda cfg, tok, units: load_tokenizer(cfg.tokenizer, "hf"))
    args = [str(src), "--tokenizer", str(GPT2_JSON), "--unit-size", "64KB", "--workers", "2", "--no-progress"]
    assert main(["tokenize", *args, "-o", str(tmp_path / "redone")]) == 0
    monkeypatch.undo()
    assert main(["tokenize", *args, "-o", str(tmp_path / "hf"), "--engine", "hf"]) == 0
    shards = [{k: v for k, v in dataset_bytes(tmp_path / out).items() if "shard-" in k} for out in ("redone", "hf")]
    assert shards[0] == shards[1] and len(shards[0]) > 1  # (the manifests differ: they name the engine asked)
