"""Every argument a user passes to StreamingDataset / StreamingDataLoader is checked when it is passed:
a value that cannot work is one `ConfigError` line naming the argument and what it must be (never a
raw ValueError or TypeError, never later in a worker)."""

import json
import os

import numpy as np
import pytest
import torch

from support.data import write_counting_dataset
from dataflow import ConfigError, StreamingDataLoader, StreamingDataset
from dataflow.loading.storage import Storage

SEQ = 16


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return write_counting_dataset(tmp_path_factory.mktemp("args"), 20_000, 60, "8KB")


BAD_DATASET = [
    ("seed", -1), ("seed", 1.5), ("seed", "7"), ("seed", True), ("seed", 2**64), ("seed", None),
    ("seq_len", 0), ("seq_len", -8), ("seq_len", 8.0), ("seq_len", True),
    ("shuffle", "yes"), ("shuffle", None), ("shuffle_window", 0), ("shuffle_window", 2.5),
    ("rank", -1), ("rank", "0"), ("rank", 1.0), ("world_size", 0), ("world_size", -2), ("world_size", "4"),
    ("position_ids", 1), ("decode_once", "no"), ("cache_dir", ""), ("cache_dir", 3),
    ("cache_limit", 1.5e9), ("cache_limit", True), ("storage_options", "anon=True"),
    ("first_contact_s", 0), ("first_contact_s", -1), ("first_contact_s", float("inf")),
    ("first_contact_s", float("nan")), ("first_contact_s", "60"),
]


@pytest.mark.parametrize("name,value", BAD_DATASET)
def test_a_bad_dataset_argument_is_one_line_before_anything_is_read(tmp_path, name, value):
    """The dataset path does not exist: the argument is named, not the missing folder."""
    kwargs = {"seq_len": SEQ, name: value}
    with pytest.raises(ConfigError) as err:
        StreamingDataset(str(tmp_path / "nowhere"), **kwargs)
    msg = str(err.value)
    assert msg.startswith(f"StreamingDataset: {name} must be ") and repr(value) in msg and "\n" not in msg


@pytest.mark.parametrize("source,said", [
    (42, "takes a dataset path or URL, a list of them or {path: weight}, got int"),
    ([], "needs at least one dataset path"), ({}, "mixing weights must be"),
    ([None], "dataset paths must be non-empty strings"), (["  "], "dataset paths must be non-empty strings"),
    ({"a": -1.0}, "mixing weights must be finite, non-negative"), ({"a": "x"}, "mixing weights must be numbers"),
    ({"a": float("nan")}, "mixing weights must be finite"), ({"a": 0, "b": 0}, "with a positive sum"),
    ({"a": True}, "mixing weights must be numbers"),
])
def test_a_bad_source_is_one_line(source, said):
    with pytest.raises(ConfigError, match=said.replace("{", r"\{").replace("}", r"\}")):
        StreamingDataset(source, seq_len=SEQ)


def test_one_dataset_listed_twice_is_refused_in_any_spelling(ds_path, tmp_path, monkeypatch):
    """It served each sample twice an epoch (2780 of 1390 in the review that found it)."""
    monkeypatch.chdir(os.path.dirname(ds_path))
    here = os.path.basename(ds_path)
    for source in ([ds_path, ds_path + "/"], {here: 1, "./" + here: 1}, [ds_path, "file://" + ds_path],
                   [ds_path, os.path.join(ds_path, "index.json")]):
        with pytest.raises(ConfigError, match="are the same dataset, listed twice") as e:
            StreamingDataset(source, seq_len=SEQ)
        assert "\n" not in str(e.value)
    assert len(StreamingDataset([ds_path], seq_len=SEQ)) > 0


def test_rank_must_be_inside_world_size(ds_path):
    with pytest.raises(ConfigError, match=r"rank 4 is outside world_size 4 \(ranks are 0 to 3\)"):
        StreamingDataset(ds_path, seq_len=SEQ, rank=4, world_size=4)


def test_numpy_integers_and_booleans_are_accepted(ds_path):
    ds = StreamingDataset(ds_path, seq_len=np.int64(SEQ), seed=np.uint32(3), rank=np.int64(1),
                          world_size=np.int32(2), shuffle=np.bool_(True), first_contact_s=np.float64(5))
    loader = StreamingDataLoader(ds, batch_size=np.int64(2), num_workers=np.int8(0), drop_last=np.bool_(True))
    first = next(iter(loader))["input_ids"]
    assert first.shape == (2, SEQ)
    assert json.loads(json.dumps(ds.state_dict()))["seed"] == 3  # plain ints: JSON-serialisable
    same = StreamingDataset(ds_path, seq_len=SEQ, seed=3, rank=1, world_size=2)
    assert torch.equal(next(iter(StreamingDataLoader(same, batch_size=2)))["input_ids"], first)


BAD_LOADER = [
    ("batch_size", 0), ("batch_size", 2.0), ("batch_size", "8"), ("batch_size", None),
    ("num_workers", -1), ("num_workers", 1.5), ("num_workers", True),
    ("prefetch_factor", 0), ("prefetch_factor", -2), ("prefetch_factor", 1.5),
    ("held_batches", -1), ("held_batches", "4"),
    ("timeout", -1), ("timeout", "5"), ("timeout", float("nan")), ("timeout", float("inf")), ("timeout", None),
    ("drop_last", "false"), ("pin_memory", 1), ("persistent_workers", None), ("cycle", "always"),
    ("multiprocessing_context", "threads"), ("multiprocessing_context", 3), ("stage_hook", "print"),
]


@pytest.mark.parametrize("name,value", BAD_LOADER)
def test_a_bad_loader_argument_is_one_line(ds_path, name, value):
    ds = StreamingDataset(ds_path, seq_len=SEQ)
    with pytest.raises(ConfigError) as err:
        StreamingDataLoader(ds, **{"batch_size": 2, name: value})
    msg = str(err.value)
    assert msg.startswith(f"StreamingDataLoader: {name} must be ") and repr(value) in msg and "\n" not in msg


def test_the_loader_takes_only_a_streaming_dataset():
    with pytest.raises(ConfigError, match="takes a StreamingDataset, got list"):
        StreamingDataLoader([1, 2, 3], batch_size=2)


@pytest.mark.parametrize("value,limit", [("none", None), ("2GB", 2 << 30), ("1048576", 1 << 20)])
def test_dataflow_cache_limit_comes_from_env_size(monkeypatch, tmp_path, value, limit):
    monkeypatch.setenv("DATAFLOW_CACHE_LIMIT", value)
    assert Storage("memory://x/ds", str(tmp_path / "c")).cache_limit == limit


@pytest.mark.parametrize("value", ["lots", "-1GB", "1e400GB"])
def test_a_bad_dataflow_cache_limit_is_one_line_naming_it(monkeypatch, ds_path, value):
    monkeypatch.setenv("DATAFLOW_CACHE_LIMIT", value)
    with pytest.raises(ConfigError, match=rf"DATAFLOW_CACHE_LIMIT='{value}' is not a size"):
        StreamingDataset(ds_path, seq_len=SEQ)


@pytest.mark.parametrize("given", [{"world_size": 2}, {"rank": 1}])
def test_rank_or_world_size_alone_is_refused_not_taken_as_rank_0(ds_path, given):
    # world_size=2 alone once made every process rank 0 of 2: all ranks read the same samples
    missing = "rank" if "world_size" in given else "world_size"
    with pytest.raises(ConfigError, match=rf"without {missing}: pass both .* or neither"):
        StreamingDataset(ds_path, seq_len=SEQ, **given)


def test_dropped_tokens_are_the_tokens_no_sample_holds(ds_path):
    ds = StreamingDataset(ds_path, seq_len=SEQ, shuffle=False)
    seen = set()  # counting tokens (all below 65,000 here): each value is one position of the corpus
    for b in StreamingDataLoader(ds, batch_size=1):  # every sample (no partial batch dropped)
        seen.update(b["input_ids"].flatten().tolist())
        seen.update(b["labels"].flatten().tolist())
    total = sum(s.tokens for _, s in ds.shards)
    assert ds.dropped_tokens == total - len(seen) > 0


@pytest.mark.parametrize("state", [{}, {"loader": {"epoch": 0}}])
def test_a_dict_that_is_no_loader_state_is_said_to_be_so(ds_path, state):
    loader = StreamingDataLoader(StreamingDataset(ds_path, seq_len=SEQ), batch_size=2)
    with pytest.raises(ConfigError, match=r"not a loader state \(its keys: .*\); pass what "
                                          r"StreamingDataLoader.state_dict\(\) returned"):
        loader.load_state_dict(state)
