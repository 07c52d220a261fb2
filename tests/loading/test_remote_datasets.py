"""`dataflow merge`, `verify`, `decode` and `inspect` of datasets on object storage (a local S3 server) and
over HTTP (a server on 127.0.0.1): the same results as for a local folder, and one-line errors naming the
shard, the part or the server when something is wrong."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.formats import remote
from support.http_files import serve
from support.s3_server import moto_s3
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 with an empty bucket `out`; its endpoint in AWS_ENDPOINT_URL."""
    with moto_s3("out", endpoint_env=True) as (_, client):
        yield client


@pytest.fixture(scope="module")
def src(kjv, tmp_path_factory):
    """The first 300 chapters of KJV as plain JSONL: several units, a few shards per task."""
    import zstandard

    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)[:300]
    path = tmp_path_factory.mktemp("src") / "kjv300.jsonl"
    path.write_bytes(b"".join(lines))
    return path


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    """Retries at once (in-process commands): a damaged shard is downloaded again without waiting."""
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)


def dataflow(*args, cache=None):
    env = dict(os.environ, **({"DATAFLOW_CACHE": str(cache)} if cache else {}))
    quiet = ["--no-progress"] if args[0] in ("tokenize", "verify", "decode") else []
    return run_dataflow(*args, *quiet, env=env)


def tokenize(src, out, *extra, cache):
    p = dataflow("tokenize", src, "-o", out, "--unit-size", "128KB", "--shard-size", "256KB", *extra, cache=cache)
    assert p.returncode == 0, p.stderr
    return p


def run(capsys, *args) -> tuple[int, str, str]:
    """A command in this process (with no backoff between retries): (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main([*map(str, args)] + (["--no-progress"] if args[0] in ("verify", "decode") else []))
    out, err = capsys.readouterr()
    return rc, out, err


def s3_json(s3, key):
    return json.loads(s3.get_object(Bucket="out", Key=key)["Body"].read())


def test_task_slices_on_s3_merge_verify_decode_and_load_as_the_local_run(s3, src, tmp_path, capsys):
    local = tmp_path / "local"
    tokenize(src, local, "--tokenizer", GPT2_JSON, "--val-fraction", "0.1", cache=tmp_path / "c")
    for task in (1, 0):  # any order, as a Slurm array would, each from its own machine (its own cache)
        tokenize(src, "s3://out/sliced", "--tokenizer", GPT2_JSON, "--val-fraction", "0.1", "--num-tasks", 2,
                 "--task-index", task, cache=tmp_path / f"c{task}")
    rc, out, err = run(capsys, "merge", "s3://out/sliced")  # the other commands in this process: no start-up
    assert rc == 0, err
    assert "train: merged 2 parts" in out and "val: merged 2 parts" in out
    for split in ("train", "val"):
        index = s3_json(s3, f"sliced/{split}/index.json")
        single = json.loads((local / split / "index.json").read_text())
        assert [s["sha256"] for s in index["shards"]] == [s["sha256"] for s in single["shards"]]
        assert {s["path"].split("/")[0] for s in index["shards"]} == {"part-00000", "part-00001"}
        url = f"s3://out/sliced/{split}"
        rc, out, err = run(capsys, "verify", url)
        assert rc == 0 and "verified" in out, err
        rc, decoded, err = run(capsys, "decode", url)
        assert rc == 0, err
        assert decoded == run(capsys, "decode", local / split)[1] and decoded.count("\n") > 10
    rc, shown, err = run(capsys, "inspect", "s3://out/sliced/train/index.json", "--decode", 2, "--json")
    assert rc == 0, err
    docs = json.loads(shown)["documents"]
    assert [d["text"] for d in docs] == [json.loads(line)["text"] for line in
                                         run(capsys, "decode", local / "train")[1].splitlines()[:2]]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="out", Prefix="sliced/")["Contents"]]
    assert len([k for k in keys if "/shard-" in k]) == len(s3_json(s3, "sliced/train/index.json")["shards"]) + \
        len(s3_json(s3, "sliced/val/index.json")["shards"])  # merging copied no shard

    from dataflow import StreamingDataset

    def windows(dataset):
        return [tuple(s["input_ids"].tolist()) for s in dataset]

    remote_ds = StreamingDataset("s3://out/sliced/train", seq_len=512, seed=1, cache_dir=str(tmp_path / "cache"))
    assert windows(remote_ds) == windows(StreamingDataset(str(local / "train"), seq_len=512, seed=1))


def test_merge_on_s3_refuses_unfinished_and_damaged_parts_in_one_line(s3, src, tmp_path, capsys):
    tokenize(src, "s3://out/half", "--num-tasks", 3, "--task-index", 1, cache=tmp_path / "c")
    rc, _, err = run(capsys, "merge", "s3://out/half")  # parts 0 and 2 never started
    assert rc == 1 and err.count("\n") == 1 and "part-00000, part-00002" in err and "Traceback" not in err
    for task in (0, 2):
        tokenize(src, "s3://out/half", "--num-tasks", 3, "--task-index", task, cache=tmp_path / "c")
    good = s3.get_object(Bucket="out", Key="half/part-00002/index.json")["Body"].read()
    s3.delete_object(Bucket="out", Key="half/part-00002/index.json")  # its shards are there, its commit is not
    rc, _, err = run(capsys, "merge", "s3://out/half")
    assert rc == 1 and err.count("\n") == 1 and "tasks not finished: part-00002" in err
    s3.put_object(Bucket="out", Key="half/part-00002/index.json", Body=good[: len(good) // 2])
    rc, _, err = run(capsys, "merge", "s3://out/half")
    assert rc == 1 and err.count("\n") == 1 and "part-00002 cannot be merged" in err and "--task-index 2" in err
    with pytest.raises(s3.exceptions.NoSuchKey):  # nothing committed by a refused merge
        s3.get_object(Bucket="out", Key="half/index.json")
    s3.put_object(Bucket="out", Key="half/part-00002/index.json", Body=good)
    rc, out, err = run(capsys, "merge", "s3://out/half")
    assert rc == 0 and "merged 3 parts" in out, err
    assert run(capsys, "verify", "s3://out/half")[0] == 0


def test_merge_of_a_missing_output_is_one_line(s3, tmp_path, capsys):
    for out in ("s3://out/nothing-here", tmp_path / "nothing-here"):
        rc, _, err = run(capsys, "merge", out)
        assert rc == 2 and err.count("\n") == 1 and "no such folder" in err


def test_verify_names_each_damaged_shard_on_s3(s3, src, tmp_path, capsys):
    tokenize(src, "s3://out/bad", cache=tmp_path / "c")
    shards = s3_json(s3, "bad/index.json")["shards"]
    assert len(shards) >= 4
    flipped, cut, gone = (f"bad/{s['path']}" for s in shards[:3])
    body = bytearray(s3.get_object(Bucket="out", Key=flipped)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket="out", Key=flipped, Body=bytes(body))  # same size, other bytes
    s3.put_object(Bucket="out", Key=cut, Body=s3.get_object(Bucket="out", Key=cut)["Body"].read()[:100])
    s3.delete_object(Bucket="out", Key=gone)
    rc, out, err = run(capsys, "verify", "s3://out/bad")
    assert rc == 1 and "Traceback" not in err
    bad = {line.split(":")[0].removeprefix("BAD ") for line in err.splitlines() if line.startswith("BAD ")}
    assert bad == {s["path"] for s in shards[:3]}
    assert "not there" in err and err.count("do not match the manifest") == 2 and "3 of" in err
    rc, _, err = run(capsys, "decode", "s3://out/bad")
    assert rc == 1 and err.count("\n") == 1 and shards[0]["path"] in err  # the first damaged shard, named


# --- over HTTP --------------------------------------------------------------------------------------
@pytest.fixture
def served(tmp_path):
    """(the folder served, its URL, the set of path endings that answer 500)."""
    with serve(tmp_path / "www") as (url, asked, failing):
        yield tmp_path / "www", url, failing


@pytest.mark.parametrize("fmt", ["arrow", "tar"])
def test_verify_inspect_decode_over_http(served, src, tmp_path, capsys, fmt):
    www, url, failing = served
    tokenize(src, www / "ds", "--tokenizer", GPT2_JSON, "--format", fmt, cache=tmp_path / "c")
    shutil.rmtree(www / "ds" / "_work", ignore_errors=True)
    rc, out, err = run(capsys, "verify", f"{url}/ds")
    assert rc == 0 and "verified" in out, err
    rc, out, err = run(capsys, "decode", f"{url}/ds")
    assert rc == 0 and out == run(capsys, "decode", www / "ds")[1], err
    rc, out, err = run(capsys, "inspect", f"{url}/ds", "--decode", 1)
    assert rc == 0 and "In the beginning God created" in out, err
    shards = json.loads((www / "ds" / "index.json").read_text())["shards"]
    failing.add(shards[1]["path"])  # the server fails on one shard, every time
    for command in ("verify", "decode"):
        rc, _, err = run(capsys, command, f"{url}/ds")
        assert rc == 1 and err.count("\n") == 1 and shards[1]["path"] in err and "500" in err, err
    failing.clear()
    failing.add("tokenizer.json")
    rc, _, err = run(capsys, "decode", f"{url}/ds")
    assert rc == 1 and err.count("\n") == 1 and "tokenizer" in err and "500" in err, err
    rc, _, err = run(capsys, "verify", f"{url}/missing")
    assert rc == 2 and err.count("\n") == 1 and "no manifest here" in err


def test_a_dataset_url_without_shard_files_is_refused_by_the_library(tmp_path):
    from dataflow.errors import ConfigError
    from dataflow.formats.manifest import Manifest, TokenizerMeta
    from dataflow.formats.verify import verify_dataset

    manifest = Manifest(tokenizer=TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256))
    with pytest.raises(ConfigError, match="pass files="):
        verify_dataset("s3://out/ds", manifest)
