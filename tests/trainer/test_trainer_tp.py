"""Tensor parallelism under torchrun on CPU (gloo): dp 2 x tp 2 trains exactly as one process on the same global
batch, its checkpoint resumes at another layout with the same global batch, and the ranks of a tensor-parallel
group that read different batches are stopped in one line naming them. All heavy (make test-all)."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dataflow.errors import TrainingAborted
from support.trainer import assert_close, losses, records
from support.parallel import STEPS, settings, run_cli
from support.parallel import baseline, kjv_data  # noqa: F401  (fixtures: the 1-process run every layout matches)

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def dp2_tp2(kjv_data, baseline, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("dp2-tp2")
    run_cli(settings(kjv_data, out, "data.batch_size=4", "train.parallel=fsdp", "train.tensor_parallel=2"), nproc=4)
    return out


def test_dp2_x_tp2_matches_one_process_step_for_step(baseline, dp2_tp2):
    assert_close(losses(dp2_tp2 / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))
    first = records(dp2_tp2 / "metrics.jsonl")[0]
    assert {k: first[k] for k in ("event", "pp", "dp_replicate", "dp_shard", "tp")} == \
        {"event": "layout", "pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    # every rank wrote its own shards, and the data position counts the data-parallel ranks' samples only
    assert len(list((dp2_tp2 / "ck" / "step-000008").glob("*.distcp"))) == 4
    state = json.loads((dp2_tp2 / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == STEPS * 8 and state["layout"]["tp"] == 2


def test_a_dp2_x_tp2_checkpoint_resumes_on_one_process_with_the_same_global_batch(kjv_data, baseline, dp2_tp2,
                                                                                 tmp_path):
    shutil.copytree(dp2_tp2 / "ck" / "step-000004", tmp_path / "ck" / "step-000004")
    # 4 processes -> 1 and batch 4 kept: train.global_batch_tokens makes it 2 micro-batches per step
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=4"))
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(5, STEPS + 1))
    event = next(r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "resume")
    assert "32 samples consumed" in event["message"] and "world size 4 -> 1" in event["message"]
    assert "layout dp_shard 2 -> 1, tp 2 -> 1" in event["message"] and "global batch" not in event["message"]
    state = json.loads((tmp_path / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == STEPS * 8 and state["tokens_per_step"] == 256


def _check(rank: int, init: str, out: str) -> None:
    from trainer.step import check_same_batch

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    ids = torch.arange(64).reshape(2, 32)
    batch = {"input_ids": ids + (rank == 1), "labels": ids}
    try:
        check_same_batch({"input_ids": ids, "labels": ids}, dist.group.WORLD, 1)  # the same: passes
        check_same_batch(batch, dist.group.WORLD, 7)
    except TrainingAborted as e:
        pathlib.Path(out, f"rank{rank}").write_text(str(e))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_ranks_with_different_batches_stop_in_one_line_naming_them(tmp_path):
    mp.spawn(_check, args=(f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=2)
    said = [(tmp_path / f"rank{r}").read_text() for r in range(2)]
    assert said[0] == said[1] and "\n" not in said[0]
    assert said[0].startswith("step 7: tensor-parallel ranks 0, 1 must compute on one batch, but rank(s) 1 read "
                              "another than rank 0"), said[0]


def test_a_dp2_x_tp2_checkpoint_resumes_at_dp4_x_tp1(kjv_data, baseline, dp2_tp2, tmp_path):
    shutil.copytree(dp2_tp2 / "ck" / "step-000004", tmp_path / "ck" / "step-000004")
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=2", "train.parallel=fsdp"), nproc=4)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(5, STEPS + 1))
    event = next(r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "resume")
    assert "layout dp_shard 2 -> 4, tp 2 -> 1" in event["message"]
    state = json.loads((tmp_path / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == STEPS * 8


def test_every_sample_is_served_once_across_a_change_from_dp2_x_tp2_to_dp4(kjv_data, baseline, tmp_path):
    """The loader's own proof, beside the losses: a dp2 x tp2 run stopped at its step-4 checkpoint and resumed at
    dp4 x tp1 is audited clean (each data-parallel replica recorded once, by its first tp rank), 8 samples a step."""
    audit = f"data.audit={tmp_path / 'audit'}"
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=4", "train.parallel=fsdp", "train.tensor_parallel=2",
                     "train.stop_at=4", audit), nproc=4)
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=2", "train.parallel=fsdp", audit), nproc=4)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(5, STEPS + 1))
    from dataflow.audit.replay import audit_folder

    report = audit_folder(str(tmp_path / "audit"))
    assert report["clean"] and report["samples"] == STEPS * 8, report["findings"]
