"""The parallel layout: train.tensor_parallel / train.pipeline_parallel beside train.parallel, refused in one line
(exit 2) before any process group when it cannot work; the data-parallel coordinate the loader is fed; the layout
record that opens log.jsonl; train.global_batch_tokens deciding the accumulation."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch.distributed as dist

from support.trainer import set_args, tiny_dataset, tiny_settings
from dataflow.distributed import data_parallel_coordinates
from dataflow.errors import ConfigError
from trainer.__main__ import main
from trainer.config import load_config
from trainer.layout import ParallelLayout, check_vocab, plan_layout
from trainer.loop import train


def config(*sets: str):
    return load_config(None, ["data.path=x", "model.n_layer=4", "model.n_head=4", "model.d_model=64",
                              "train.parallel=fsdp", *sets])


@pytest.mark.parametrize("sets,world,said", [
    (["train.tensor_parallel=3"], 3, "train.tensor_parallel = 3 does not divide model.n_head = 4"),
    (["train.tensor_parallel=2", "model.mlp_ratio=2.75", "model.d_model=36", "model.n_head=2"], 2,
     "does not divide the MLP's 99 hidden units"),
    (["train.pipeline_parallel=3"], 3, "train.pipeline_parallel = 3 does not divide model.n_layer = 4"),
    (["train.tensor_parallel=2"], 3, "3 process(es) cannot be laid out as tp 2 x pp 1"),
    (["train.tensor_parallel=2", "train.parallel=ddp"], 2, "need train.parallel = \"fsdp\" or \"hsdp\""),
    (["train.pipeline_parallel=2", "train.parallel=ddp"], 2, "need train.parallel = \"fsdp\" or \"hsdp\""),
    (["train.parallel=hsdp", "train.hsdp_replicas=3", "train.tensor_parallel=2"], 8,
     "train.hsdp_replicas = 3 does not divide the 4 data-parallel ranks"),
    (["train.pipeline_parallel=2", "data.doc_mask=true"], 4, "the stages pass hidden states only"),
    (["train.global_batch_tokens=100", "data.seq_len=32"], 1, "not a whole number of samples of data.seq_len = 32"),
    (["train.global_batch_tokens=96", "data.seq_len=32", "data.batch_size=2"], 2,
     "(3 samples) is not a whole number of micro-batches of data.batch_size 2 x 2 data-parallel rank(s)"),
])
def test_an_impossible_layout_is_one_line(sets, world, said):
    with pytest.raises(ConfigError) as e:
        plan_layout(config(*sets), world, world)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_layouts_that_work():
    assert plan_layout(config(), 1) == ParallelLayout()
    assert plan_layout(config("train.pipeline_parallel=2"), 8) == ParallelLayout(2, 1, 4, 1)
    assert plan_layout(config("train.pipeline_parallel=2", "train.tensor_parallel=2"), 8) == ParallelLayout(2, 1, 2, 2)
    assert plan_layout(config("train.parallel=ddp"), 4) == ParallelLayout(1, 4, 1, 1)
    assert plan_layout(config("train.tensor_parallel=2"), 4) == ParallelLayout(1, 1, 2, 2)
    # hsdp's replicas are the nodes; the shard group is what is left of a node after tensor parallelism
    assert plan_layout(config("train.parallel=hsdp", "train.tensor_parallel=2"), 16, 8) == ParallelLayout(1, 2, 4, 2)
    assert plan_layout(config("train.parallel=hsdp", "train.tensor_parallel=4", "train.hsdp_replicas=1"),
                       16, 8).record() == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 4}


def test_global_batch_tokens_decides_the_accumulation():
    sets = ["train.global_batch_tokens=1024", "data.seq_len=32", "data.batch_size=4", "train.grad_accum=5"]
    assert plan_layout(config(*sets), 1).grad_accum == 8  # 32 samples / (4 x 1 rank)
    assert plan_layout(config(*sets), 2).grad_accum == 4
    assert plan_layout(config(*sets, "train.tensor_parallel=2"), 4).grad_accum == 4  # tp ranks read one batch
    assert plan_layout(config(*sets[1:]), 2).grad_accum == 5  # unset: train.grad_accum
    with pytest.raises(ConfigError, match="data.batch_size = 2 would give it exactly"):
        plan_layout(config(*sets[:-1], "data.batch_size=3"), 4)


def test_the_padded_vocabulary_must_split_over_tensor_parallel():
    m = config("model.vocab_multiple=64").model
    check_vocab(ParallelLayout(tp=4), m, 257)  # padded to 320
    with pytest.raises(ConfigError, match="does not divide the padded vocabulary of 320 rows .* set "
                                          "model.vocab_multiple = 192"):
        check_vocab(ParallelLayout(tp=3), m, 257)


def test_the_data_parallel_coordinate_from_torchruns_environment(monkeypatch):
    assert data_parallel_coordinates() == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "8")
    seen = []
    for rank in range(8):  # (pp 2, dp 2, tp 2), tp innermost as init_device_mesh lays it out
        monkeypatch.setenv("RANK", str(rank))
        seen.append(data_parallel_coordinates(tensor_parallel=2, pipeline_parallel=2))
    assert seen == [(0, 2), (0, 2), (1, 2), (1, 2), (0, 2), (0, 2), (1, 2), (1, 2)]
    monkeypatch.setenv("RANK", "5")
    assert data_parallel_coordinates(tensor_parallel=2) == (2, 4)
    with pytest.raises(ConfigError, match="8 processes .* cannot split into tensor_parallel 3"):
        data_parallel_coordinates(tensor_parallel=3)


class _Mesh:
    """What data_parallel_coordinates reads of a DeviceMesh: names, sizes, this rank's coordinate."""

    def __init__(self, names, sizes, coordinate):
        self.mesh_dim_names, self.sizes, self.coordinate = names, sizes, coordinate

    def size(self, i):
        return self.sizes[i]

    def get_coordinate(self):
        return self.coordinate


def test_the_data_parallel_coordinate_of_a_mesh_flattens_its_data_dimensions():
    names = ("pp", "dp_replicate", "dp_shard", "tp")
    assert data_parallel_coordinates(_Mesh(names, (2, 2, 3, 4), [1, 1, 2, 3])) == (5, 6)
    assert data_parallel_coordinates(_Mesh(("dp", "tp"), (4, 2), [3, 1])) == (3, 4)
    assert data_parallel_coordinates(_Mesh(("tp",), (8,), [5])) == (0, 1)
    with pytest.raises(ConfigError, match="no dimension names"):
        data_parallel_coordinates(_Mesh(None, (4,), [0]))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> pathlib.Path:
    return tiny_dataset(tmp_path_factory.mktemp("layout") / "data")


@pytest.mark.parametrize("env,sets,said", [
    ({"WORLD_SIZE": "3", "RANK": "0"}, ["train.parallel=fsdp", "train.tensor_parallel=2"],
     "3 process(es) cannot be laid out as tp 2"),
    ({}, ["train.tensor_parallel=2"], "need train.parallel = \"fsdp\" or \"hsdp\""),
    # the vocabulary is the dataset's: 257 tokens padded to 320 rows, which 3 ranks cannot split
    ({"WORLD_SIZE": "3", "RANK": "0"}, ["train.parallel=fsdp", "train.tensor_parallel=3", "model.n_head=3",
                                        "model.d_model=48"], "does not divide the padded vocabulary of 320 rows"),
])
def test_the_cli_refuses_an_impossible_layout_before_any_process_group(data, tmp_path, monkeypatch, capsys, env,
                                                                      sets, said):
    for k, v in env.items():  # torchrun's world without torchrun: no MASTER_ADDR, so a process group would fail
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert main(["--config", "demo", *set_args(tiny_settings(data, tmp_path / "ck", "log.jsonl=", *sets))]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and not dist.is_initialized(), err
    assert not (tmp_path / "ck").exists()  # nothing was started


def test_the_first_record_and_a_start_up_line_state_the_layout(data, tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    sets = tiny_settings(data, tmp_path / "ck", f"log.jsonl={log}", "train.steps=2", "data.batch_size=2",
                         "train.grad_accum=3", "train.global_batch_tokens=256")
    train(load_config("demo", sets))
    first = json.loads(log.read_text().splitlines()[0])
    assert {k: first[k] for k in ("event", "pp", "dp_replicate", "dp_shard", "tp", "grad_accum")} == \
        {"event": "layout", "pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, "grad_accum": 4}
    out = capsys.readouterr().out
    assert "layout: pp 1 x dp 1 (replicate 1, shard 1) x tp 1 = 1 process(es); 4 micro-batch(es) of 2 x 32" in out
    assert "train.grad_accum = 3 ignored: train.global_batch_tokens = 256 gives 4 micro-batch(es)" in out


def _losses(path: pathlib.Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r}


def test_a_resume_with_less_data_parallelism_keeps_the_global_batch(data, tmp_path):
    """Half the samples per micro-step on resume (as with half the processes): train.global_batch_tokens doubles
    the accumulation, so the steps go on as the uninterrupted run's; without it the log says the batch shrank."""
    def run(name: str, *extra: str) -> pathlib.Path:
        log = tmp_path / f"{name}.jsonl"
        train(load_config("demo", tiny_settings(data, tmp_path / name.split("-")[0], f"log.jsonl={log}", "log.every=1",
                                                "train.steps=6", "train.warmup_steps=1", *extra)))
        return log

    full = _losses(run("full", "data.batch_size=8", "train.global_batch_tokens=256"))
    run("cut", "data.batch_size=8", "train.global_batch_tokens=256", "train.stop_at=3")
    shutil.copytree(tmp_path / "cut", tmp_path / "plain")
    resumed = run("cut-resumed", "data.batch_size=4", "train.global_batch_tokens=256")
    assert sorted(_losses(resumed)) == [4, 5, 6]
    assert all(_losses(resumed)[s] == pytest.approx(full[s], rel=1e-4) for s in (4, 5, 6))
    plain = run("plain-resumed", "data.batch_size=4")
    event = next(r for r in map(json.loads, plain.read_text().splitlines()) if r.get("event") == "resume")
    assert "global batch 256 -> 128 tokens per step" in event["message"]


def test_the_70b_config_lays_out_as_its_comments_say():
    import torch

    from trainer.config import builtin_configs
    from trainer.model import GPT

    cfg = load_config(builtin_configs()["gpt-70b-3d"], ["data.path=unused"])
    with torch.device("meta"):
        assert GPT(cfg.model, 50257, cfg.data.seq_len).num_params() == 64_837_918_720
    layout = plan_layout(cfg, 128, 8)  # 16 nodes of 8 GPUs
    assert layout == ParallelLayout(pp=4, dp_replicate=2, dp_shard=2, tp=8, grad_accum=256)
    check_vocab(layout, cfg.model, 50257)
    assert 16 * 64_837_918_720 / (layout.tp * layout.pp * layout.dp_shard) < 16.3e9  # fp32 states per GPU
    bigger = load_config(builtin_configs()["gpt-70b-3d"], ["data.path=unused", "train.hsdp_replicas=4"])
    assert plan_layout(bigger, 256, 8) == ParallelLayout(4, 4, 2, 8, grad_accum=128)  # 32 nodes: the same global batch


class _Stages:
    """A mesh as stage_index reads it: this rank's coordinate on the pp dimension."""

    def __init__(self, stage):
        self.stage = stage

    def get_local_rank(self, name):
        assert name == "pp"
        return self.stage


def test_only_the_first_and_last_pipeline_stage_start_loader_workers(data, tmp_path, monkeypatch):
    from trainer.build import build_data
    from trainer.parallelize import Dist

    cfg = load_config("demo", tiny_settings(data, tmp_path / "ck", "data.num_workers=2", "model.n_layer=4"))
    workers = {}
    monkeypatch.setenv("WORLD_SIZE", "4")
    for stage in range(4):  # pp 4 x dp 1 x tp 1: rank r is stage r
        monkeypatch.setenv("RANK", str(stage))
        d = Dist(layout=ParallelLayout(pp=4), mesh=_Stages(stage))
        _, loader, _ = build_data(cfg, d)
        workers[stage] = loader.num_workers
        loader.close()
    assert workers == {0: 2, 1: 0, 2: 0, 3: 2}
