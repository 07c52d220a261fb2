"""Pipeline parallelism under torchrun on CPU (gloo): pp 2 x dp 2 (1F1B over 2 micro-batches, FSDP2 within each
stage, the tied embedding's gradient summed over the first and last stage) trains as one process on the same global
batch, and checkpoints reshard between pipeline and non-pipeline layouts. All heavy (make test-all)."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from support.parallel import STEPS, run_cli, settings
from support.trainer import assert_close, losses, records
from support.parallel import baseline, kjv_data  # noqa: F401  (fixtures: the 1-process run every layout matches)

pytestmark = pytest.mark.heavy
PP2_DP2 = ("data.batch_size=2", "train.parallel=fsdp", "train.pipeline_parallel=2")  # 2 micro-batches per step


@pytest.fixture(scope="module")
def pp2_dp2(kjv_data, baseline, tmp_path_factory) -> pathlib.Path:  # noqa: F811
    out = tmp_path_factory.mktemp("pp2-dp2")
    run_cli(settings(kjv_data, out, *PP2_DP2), nproc=4)
    return out


def test_pp2_x_dp2_matches_one_process_step_for_step(baseline, pp2_dp2):  # noqa: F811
    assert_close(losses(pp2_dp2 / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))
    first = records(pp2_dp2 / "metrics.jsonl")[0]
    assert {k: first[k] for k in ("event", "pp", "dp_replicate", "dp_shard", "tp", "grad_accum")} == \
        {"event": "layout", "pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "grad_accum": 2}
    state = json.loads((pp2_dp2 / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == STEPS * 8 and state["layout"]["pp"] == 2


def test_a_pipeline_checkpoint_resumes_at_dp2_x_tp2(kjv_data, baseline, pp2_dp2, tmp_path):  # noqa: F811
    shutil.copytree(pp2_dp2 / "ck" / "step-000004", tmp_path / "ck" / "step-000004")
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=4", "train.parallel=fsdp", "train.tensor_parallel=2"),
            nproc=4)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(5, STEPS + 1))
    event = next(r for r in records(tmp_path / "metrics.jsonl") if r.get("event") == "resume")
    assert "32 samples consumed" in event["message"] and "layout pp 2 -> 1, tp 1 -> 2" in event["message"]


def test_a_one_process_checkpoint_resumes_as_a_pipeline(kjv_data, baseline, tmp_path):  # noqa: F811
    # the 1-process run saved the tied matrix's optimizer state once (tok_emb.weight): the last stage reads its copy
    shutil.copytree(baseline / "ck" / "step-000004", tmp_path / "ck" / "step-000004")
    run_cli(settings(kjv_data, tmp_path, *PP2_DP2), nproc=4)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(5, STEPS + 1))
    state = json.loads((tmp_path / "ck" / "step-000008" / "trainer_state.json").read_text())
    assert state["loader"]["consumed"] == STEPS * 8


def test_four_stages_match_one_process_with_the_tied_matrix_across_the_pipeline(kjv_data, tmp_path):  # noqa: F811
    """pp 4 (1F1B over 4 micro-batches): the embedding on stage 0 and lm_head on stage 3 stay one matrix."""
    deep = ("model.n_layer=4", "data.num_workers=1")
    run_cli(settings(kjv_data, tmp_path / "one", "data.batch_size=8", *deep))
    run_cli(settings(kjv_data, tmp_path / "pp4", "data.batch_size=2", "train.parallel=fsdp",
                     "train.pipeline_parallel=4", *deep), nproc=4)
    assert_close(losses(tmp_path / "pp4" / "metrics.jsonl"), losses(tmp_path / "one" / "metrics.jsonl"),
                 range(1, STEPS + 1))


def test_three_dimensions_pp2_x_dp2_x_tp2_match_one_process(kjv_data, baseline, tmp_path):  # noqa: F811
    """8 processes: stages of tensor-parallel groups, FSDP2 over 2 data-parallel ranks (the embedding's replicated
    gradient is laid out as its row-split weight before the first and last stage sum it)."""
    run_cli(settings(kjv_data, tmp_path, "data.batch_size=2", "train.parallel=fsdp", "train.pipeline_parallel=2",
                     "train.tensor_parallel=2"), nproc=8, timeout=600)
    assert_close(losses(tmp_path / "metrics.jsonl"), losses(baseline / "metrics.jsonl"), range(1, STEPS + 1))
    first = records(tmp_path / "metrics.jsonl")[0]
    assert {k: first[k] for k in ("pp", "dp_replicate", "dp_shard", "tp")} == \
        {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
