"""Training runs of a tiny GPT on the real KJV corpus: parallel equivalence, exact and elastic resume,
the NaN guard, checkpoint retention, signals, and learning.

One baseline run (1 process, batch 8, 20 steps, checkpoints at 10 and 20) is shared; the other runs
are compared with it step by step through their JSONL logs.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import threading
import time

import pytest
import torch

from support import trainer as support
from support.trainer import assert_close, losses, records
from dataflow.errors import ConfigError, DataflowError
from trainer.checkpoint import Checkpointer, complete_checkpoints
from trainer.config import load_config
from trainer.loop import TrainingAborted, train
from trainer.model import GPT
from trainer.optim import build_optimizer
from trainer.parallelize import Dist

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20


@pytest.fixture(scope="session")
def kjv_data(tmp_path_factory, kjv) -> pathlib.Path:
    """KJV tokenized with the byte tokenizer into ~31 train shards and a validation split."""
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    out = tmp_path_factory.mktemp("kjv-bytes")
    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(out), shard_size="256KB", val_fraction=0.05,
                            workers=1, progress=False))
    return out


def settings(data: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    """A tiny model on CPU in fp32, logging every step; `extra` overrides come last."""
    return [f"data.path={data / 'train'}", "data.seq_len=32", "data.batch_size=8", "data.num_workers=0",
            "model.n_layer=2", "model.n_head=2", "model.d_model=32",
            f"train.steps={STEPS}", "train.warmup_steps=4", "train.lr=3e-3", "train.min_lr=3e-4",
            "train.precision=fp32", "train.device=cpu", "train.parallel=ddp",
            f"checkpoint.dir={out / 'ck'}", "checkpoint.every=10", "checkpoint.keep=3",
            f"log.jsonl={out / 'metrics.jsonl'}", "log.every=1", *extra]


def run_here(sets: list[str]) -> dict:
    return train(load_config(None, sets))


def run_cli(sets: list[str], nproc: int = 1) -> subprocess.CompletedProcess:
    """The trainer on configs/demo.toml as a file (its relative paths read against configs/)."""
    return support.run_cli(sets, nproc, config=str(ROOT / "configs" / "demo.toml"))


@pytest.fixture(scope="module")
def baseline(kjv_data, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("baseline")
    result = run_here(settings(kjv_data, out))
    assert result["step"] == STEPS and result["skipped_steps"] == 0
    assert [s for s, _ in complete_checkpoints(str(out / "ck"))] == [10, 20]
    return out


def killed_after_step_10(baseline: pathlib.Path, out: pathlib.Path) -> None:
    """The baseline's checkpoints as a run killed between its step-10 and step-20 saves leaves them."""
    shutil.copytree(baseline / "ck", out / "ck")
    shutil.rmtree(out / "ck" / "step-000020")
    shutil.copytree(out / "ck" / "step-000010", out / "ck" / "step-000020.tmp")  # a half-written save


# --- parallel equivalence ---------------------------------------------------------------------------
@pytest.mark.heavy  # two processes on gloo (make test-all)
def test_ddp_two_processes_match_one(kjv_data, baseline, tmp_path):
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=4"), nproc=2)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))


@pytest.mark.heavy  # two processes on gloo (make test-all)
def test_fsdp2_two_processes_with_accumulation_match_one(kjv_data, baseline, tmp_path):
    run_cli(settings(kjv_data, tmp_path, "train.parallel=fsdp", "data.batch_size=2", "train.grad_accum=2"), nproc=2)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))
    # a sharded checkpoint: one DCP file per rank
    assert len(list((tmp_path / "ck" / "step-000020").glob("*.distcp"))) == 2


def test_grad_accumulation_matches_larger_batch(kjv_data, baseline, tmp_path):
    run_here(settings(kjv_data, tmp_path, "data.batch_size=4", "train.grad_accum=2"))
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))


# --- resume -----------------------------------------------------------------------------------------
def test_exact_resume_in_a_new_process_is_bitwise_identical(kjv_data, baseline, tmp_path):
    killed_after_step_10(baseline, tmp_path)
    run_cli(settings(kjv_data, tmp_path, "checkpoint.resume=auto"))
    resumed, full = losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl")
    assert sorted(resumed) == list(range(11, STEPS + 1))
    assert [resumed[s] for s in range(11, STEPS + 1)] == [full[s] for s in range(11, STEPS + 1)]
    event = next(r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "resume")
    assert event["step"] == 10 and "step-000010" in event["message"]
    assert not (tmp_path / "ck" / "step-000020.tmp").exists()  # replaced by the complete step-000020


@pytest.mark.heavy  # two processes on gloo (make test-all)
def test_elastic_resume_on_two_hsdp_processes_continues_the_stream(kjv_data, baseline, tmp_path):
    killed_after_step_10(baseline, tmp_path)
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=4", "train.parallel=hsdp", "train.hsdp_replicas=2"),
            nproc=2)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(11, STEPS + 1))
    event = next(r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "resume")
    assert "80 samples consumed" in event["message"] and "world size 1 -> 2" in event["message"]
    state = json.loads((tmp_path / "ck" / "step-000020" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["loader"]["consumed"] == STEPS * 8 and state["loader"]["epoch"] == 0


def _load_plain(path: str, sets: list[str]) -> tuple[GPT, torch.optim.Optimizer]:
    cfg = load_config(None, sets)
    model = GPT(cfg.model, vocab_size=257, max_len=cfg.data.seq_len)
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    Checkpointer("", 1, Dist()).load(path, model, optimizer)
    return model, optimizer


# --- guards -----------------------------------------------------------------------------------------
def test_nan_step_is_skipped_and_training_continues(kjv_data, tmp_path):
    nan = settings(kjv_data, tmp_path / "nan", "train.steps=5", "train.inject_nan_step=3", "train.decay=constant",
                   "checkpoint.every=2", "train.stop_at=3")
    result = run_here(nan)
    assert result["skipped_steps"] == 1 and result["step"] == 3
    recs = records(tmp_path / "nan" / "metrics.jsonl")
    assert [r["step"] for r in recs if r.get("event") == "nonfinite"] == [3]
    step3 = next(r for r in recs if r.get("step") == 3 and "loss" in r)
    assert step3["loss"] is None and step3["skipped_steps"] == 1
    # the skipped step left weights and optimizer exactly as after step 2
    after2, opt2 = _load_plain(str(tmp_path / "nan" / "ck" / "step-000002"), nan)
    after3, opt3 = _load_plain(str(tmp_path / "nan" / "ck" / "step-000003"), nan)
    assert all(torch.equal(p, q) for p, q in zip(after2.parameters(), after3.parameters()))
    assert opt2.state_dict()["state"][0]["step"] == opt3.state_dict()["state"][0]["step"] == 2
    # ... and training goes on from there with finite losses
    result = run_here(nan[:-1])
    assert result["step"] == 5 and result["skipped_steps"] == 1
    later = losses(tmp_path / "nan" / "metrics.jsonl")
    assert all(later[s][0] is not None and later[s][0] < 6 for s in (4, 5))


def test_too_many_bad_steps_abort_with_a_clear_message(kjv_data, tmp_path):
    with pytest.raises(TrainingAborted, match="1 non-finite steps in a row .*max_bad_steps = 1"):
        run_here(settings(kjv_data, tmp_path, "train.inject_nan_step=2", "train.max_bad_steps=1"))


# --- checkpoints ------------------------------------------------------------------------------------
def test_retention_stop_at_and_half_written_checkpoints(kjv_data, tmp_path):
    sets = settings(kjv_data, tmp_path, "train.steps=9", "checkpoint.every=2", "checkpoint.keep=2")
    result = run_here(sets + ["train.stop_at=7"])
    assert result["step"] == 7
    ck = tmp_path / "ck"
    assert sorted(os.listdir(ck)) == ["step-000006", "step-000007"]
    shutil.copytree(ck / "step-000007", ck / "step-000009.tmp")  # a save killed before its rename
    (ck / "step-000008").mkdir()  # a partial folder without trainer_state.json
    (ck / "step-000008" / "__0_0.distcp").write_bytes(b"garbage")
    result = run_here(sets)
    assert result["resumed_from"].endswith("step-000007") and result["step"] == 9
    assert [s for s, _ in complete_checkpoints(str(ck))] == [8, 9]
    assert not (ck / "step-000009.tmp").exists()


def test_sigterm_saves_a_checkpoint_and_leaves_cleanly(kjv_data, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    before = signal.getsignal(signal.SIGTERM)

    def kill_after_two_steps() -> None:  # what a cluster scheduler does at the end of a time slice
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if metrics.exists() and sum(1 for r in records(metrics) if "loss" in r) >= 2:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=kill_after_two_steps, daemon=True)
    killer.start()
    result = run_here(settings(kjv_data, tmp_path, "train.steps=100000", "checkpoint.every=100000"))
    killer.join()
    (step, path), = complete_checkpoints(str(tmp_path / "ck"))
    assert 2 <= step == result["step"] < 100000
    assert any(r.get("event") == "stop" for r in records(metrics))
    assert signal.getsignal(signal.SIGTERM) is before  # the trainer's handler is gone again


# --- learning ---------------------------------------------------------------------------------------
def test_loss_decreases_on_real_text_with_document_masking(kjv_data, tmp_path):
    result = run_here(settings(kjv_data, tmp_path, "data.doc_mask=true", "model.d_model=64", "model.n_head=4",
                               "train.steps=30", f"data.val_path={kjv_data / 'val'}", "train.eval_every=15",
                               "train.eval_batches=4", "checkpoint.dir="))
    curve = [v[0] for _, v in sorted(losses(tmp_path / "metrics.jsonl").items())]
    assert len(curve) == 30 and curve[0] > 5.0
    assert sum(curve[-5:]) / 5 < curve[0] - 1.5
    evals = [r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [15, 30] and evals[1]["val_loss"] < evals[0]["val_loss"] < 5.0
    assert result["val_loss"] == evals[1]["val_loss"]
    assert result["summary"]["steps"] == 30 and 0 <= result["summary"]["data_wait_pct"] <= 100


def test_a_dataset_too_small_for_one_batch_is_a_config_error(kjv_data, tmp_path):
    with pytest.raises(ConfigError, match="too few"):
        run_here(settings(kjv_data, tmp_path, f"data.path={kjv_data / 'val'}", "data.seq_len=1024",
                          "data.batch_size=4096"))


def test_loss_spike_rolls_back_once_and_skips_the_data(kjv_data, tmp_path):
    # spike_factor 0.1 makes every step after the first a "spike": the first one after a checkpoint rolls
    # back to it; later spikes of the same checkpoint are only logged
    result = run_here(settings(kjv_data, tmp_path, "train.steps=8", "checkpoint.every=4",
                               "train.spike_factor=0.1", "train.spike_rollback=true"))
    recs = records(tmp_path / "metrics.jsonl")
    rollbacks = [r for r in recs if r.get("event") == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0]["step"] == 4 and "step-000004" in rollbacks[0]["message"]
    assert sum(r.get("event") == "spike" for r in recs) >= 6
    assert result["step"] == 8
    state = json.loads((tmp_path / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == 9 * 8  # the rolled-back step's batch is not replayed


def test_resume_with_a_different_model_is_refused(kjv_data, baseline, tmp_path):
    shutil.copytree(baseline / "ck", tmp_path / "ck")
    with pytest.raises(ConfigError, match=r"model differs .*d_model: 32 -> 64"):
        run_here(settings(kjv_data, tmp_path, "model.d_model=64"))


def test_a_tokenize_output_with_splits_is_explained(kjv_data, tmp_path):
    with pytest.raises(DataflowError, match=r"holds the splits train, val; pass one of them, e\.g\. .*train"):
        run_here(settings(kjv_data, tmp_path, f"data.path={kjv_data}"))


def test_training_runs_on_across_epochs_and_resumes_inside_the_second(tmp_path, kjv):
    import zstandard

    from dataflow import ShardWriter, TokenizerMeta

    # a small dataset of real text: 3 documents, ~14 batches of 8 x 33 tokens per epoch
    with open(kjv, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        docs = [json.loads(line)["text"] for line in r.read(200_000).decode("utf-8", "ignore").splitlines()[:3]]
    data = tmp_path / "small"
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    with ShardWriter(str(data), tokenizer_meta=meta, shard_size="2KB") as w:
        for i, text in enumerate(docs):
            w.write(list(text.encode()[:1200]) + [256], id=f"doc-{i}")
    sets = settings(tmp_path, tmp_path / "run", f"data.path={data}", "train.steps=36", "checkpoint.every=18")
    run_here(sets)
    recs = [r for r in records(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    epochs = [r["epoch"] for r in recs]
    assert len(recs) == 36 and epochs == sorted(epochs) and epochs[-1] >= 2
    # resume from step 18 (inside epoch 1) gives the same steps 19..36
    shutil.rmtree(tmp_path / "run" / "ck" / "step-000036")
    sets = [s.replace("metrics.jsonl", "resumed.jsonl") for s in sets]
    run_here(sets)
    resumed = losses(tmp_path / "run" / "resumed.jsonl")
    full = {r["step"]: (r["loss"], r["grad_norm"]) for r in recs}
    assert sorted(resumed) == list(range(19, 37)) and all(resumed[s] == full[s] for s in resumed)


def test_the_trainer_hands_the_loader_itself_to_the_prefetcher(kjv_data, tmp_path, monkeypatch):
    """The product's path: no generator between the loader and the prefetcher (a generator hid the loader's
    pinning and slot sizing, and carried the resume state beside the batches)."""
    import dataflow
    from trainer import loop

    seen = []
    real = dataflow.DevicePrefetcher

    def recording(batches, **kw):
        pf = real(batches, **kw)
        seen.append((batches, pf))
        return pf

    monkeypatch.setattr(loop.dataflow, "DevicePrefetcher", recording)
    sets = settings(kjv_data, tmp_path, "train.steps=3", "checkpoint.every=3", "data.num_workers=1")
    assert run_here(sets)["step"] == 3
    (upstream, pf), = seen
    assert isinstance(upstream, dataflow.StreamingDataLoader) and upstream.cycle
    assert upstream.pin_memory is False and pf.pinned is False  # on CPU; pin_memory follows the device
    state = json.loads((tmp_path / "ck" / "step-000003" / "trainer_state.json").read_text())["loader"]
    assert state == pf.state_dict() and state["consumed"] == 3 * 8  # steps x batch (1 process)
