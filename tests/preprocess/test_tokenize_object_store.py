"""`dataflow tokenize -o s3://...`: workers upload finished shards to final names, the manifest is the commit
point, the journal and the lock stay in a local work folder; `verify` and `StreamingDataset` read it back."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from support import kill_points
from support.s3_server import moto_s3
from support.cli import DATAFLOW
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 with an empty bucket `out`; its endpoint in AWS_ENDPOINT_URL."""
    with moto_s3("out", endpoint_env=True) as (_, client):
        yield client


def tokenize(src, out, *extra, cache):
    env = dict(os.environ, DATAFLOW_CACHE=str(cache))
    return run_dataflow("tokenize", src, "-o", out, "--no-progress", "--unit-size", "256KB", "--shard-size", "512KB",
                        *extra, env=env)


def decoded(dataset) -> list[str]:
    p = subprocess.run([*DATAFLOW, "decode", str(dataset), "--no-progress"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def shard_hashes(manifest: dict) -> list[str]:
    return [s["sha256"] for s in manifest["shards"]]


def test_tokenize_to_s3_verifies_and_reads_back_as_the_local_run(s3, kjv, tmp_path):
    local = tmp_path / "local"
    assert tokenize(kjv, local, "--workers", "2", "--val-fraction", "0.1", cache=tmp_path / "c").returncode == 0
    p = tokenize(kjv, "s3://out/ds", "--workers", "2", "--val-fraction", "0.1", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    for split in ("train", "val"):
        remote = json.loads(s3.get_object(Bucket="out", Key=f"ds/{split}/index.json")["Body"].read())
        assert shard_hashes(remote) == shard_hashes(json.loads((local / split / "index.json").read_text()))
        assert all(s["path"].startswith("shard-") for s in remote["shards"])
        # a copy of what the bucket holds verifies and decodes as the local run (the bucket itself is
        # verified and decoded in place in tests/loading/test_remote_datasets.py)
        import fsspec

        fsspec.filesystem("s3").get(f"out/ds/{split}/", str(tmp_path / "copy" / split) + "/", recursive=True)
        assert subprocess.run([*DATAFLOW, "verify", str(tmp_path / "copy" / split), "--no-progress"]).returncode == 0
        assert decoded(tmp_path / "copy" / split) == decoded(local / split)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="out", Prefix="ds/")["Contents"]}
    assert "ds/_errors.jsonl" in keys and not any("_work" in k for k in keys)
    assert not os.listdir(tmp_path / "c" / "tokenize-work")  # the local work folder went with the run

    from dataflow import StreamingDataset

    def windows(dataset):  # every window, so that no read is left running when the server stops
        return [tuple(s["input_ids"].tolist()) for s in dataset]

    remote = StreamingDataset("s3://out/ds/train", seq_len=4096, seed=1, cache_dir=str(tmp_path / "cache"))
    assert windows(remote) == windows(StreamingDataset(str(local / "train"), seq_len=4096, seed=1))


def test_a_killed_upload_run_resumes_to_the_same_shards(s3, kjv, tmp_path):
    import zstandard

    plain = tmp_path / "kjv.jsonl"  # cut into byte ranges: the kill points count units
    plain.write_bytes(zstandard.ZstdDecompressor().stream_reader(open(kjv, "rb")).read())
    kjv = plain
    ref = tokenize(kjv, "s3://out/ref", "--workers", "1", cache=tmp_path / "c")
    assert ref.returncode == 0, ref.stderr
    args = ["tokenize", str(kjv), "-o", "s3://out/killed", "--no-progress", "--unit-size", "256KB",
            "--shard-size", "512KB"]
    env = dict(os.environ, DATAFLOW_CACHE=str(tmp_path / "c"))
    for workers, when in [(1, {"shard": "after", "unit": 3}), (2, {"renamed": 8})]:
        p = subprocess.run(kill_points.command(when, *args, "--workers", workers), capture_output=True, env=env)
        assert p.returncode == -signal.SIGKILL, p.stderr.decode()
        with pytest.raises(s3.exceptions.NoSuchKey):  # no manifest: no dataset yet
            s3.get_object(Bucket="out", Key="killed/index.json")
    p = tokenize(kjv, "s3://out/killed", "--workers", "2", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    manifests = [json.loads(s3.get_object(Bucket="out", Key=f"{d}/index.json")["Body"].read()) for d in
                 ("ref", "killed")]
    assert [s["path"] for s in manifests[0]["shards"]] == [s["path"] for s in manifests[1]["shards"]]
    assert shard_hashes(manifests[0]) == shard_hashes(manifests[1])
    listed = {f"killed/{s['path']}" for s in manifests[1]["shards"]}
    shards = {o["Key"] for o in s3.list_objects_v2(Bucket="out", Prefix="killed/shard-")["Contents"]}
    assert shards == listed


@pytest.mark.heavy  # a Ray cluster in-process (make test-all)
def test_ray_tasks_upload_their_shards_to_s3(s3, kjv, tmp_path, monkeypatch):
    """A Ray job spread over machines writes one dataset: each task uploads its own shards."""
    import ray

    from dataflow.preprocess.run import TokenizeConfig, tokenize as run_tokenize

    assert tokenize(kjv, tmp_path / "local", "--workers", "2", cache=tmp_path / "c").returncode == 0
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "c"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_tokenize(TokenizeConfig(inputs=[str(kjv)], out="s3://out/ray", shard_size="512KB", unit_bytes=256 << 10,
                                    workers=2, executor="ray", progress=False))
    finally:
        ray.shutdown()
    remote = json.loads(s3.get_object(Bucket="out", Key="ray/index.json")["Body"].read())
    assert shard_hashes(remote) == shard_hashes(json.loads((tmp_path / "local" / "index.json").read_text()))


def test_a_finished_s3_dataset_is_kept_refused_or_overwritten(s3, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(2000)))
    assert tokenize(src, "s3://out/again", cache=tmp_path / "c").returncode == 0
    p = tokenize(src, "s3://out/again", cache=tmp_path / "c")
    assert p.returncode == 0 and "already complete" in p.stdout
    p = tokenize(src, "s3://out/again", "--shard-size", "1MB", cache=tmp_path / "c")
    assert p.returncode == 2 and "shard_size" in p.stderr and "--overwrite" in p.stderr
    p = tokenize(src, "s3://out/again", "--shard-size", "64KB", "--overwrite", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    manifest = json.loads(s3.get_object(Bucket="out", Key="again/index.json")["Body"].read())
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="out", Prefix="again/shard-")["Contents"]}
    assert keys == {f"again/{s['path']}" for s in manifest["shards"]} and len(keys) > 1


@pytest.mark.parametrize("case", ["no bucket", "unreachable", "no credentials"])
def test_an_output_the_store_refuses_is_one_line_before_any_work(s3, kjv, tmp_path, monkeypatch, case):
    out, said = "s3://out/refused", None
    if case == "no bucket":
        out, said = "s3://no-such-bucket/ds", "the bucket 'no-such-bucket' does not exist; create it"
    elif case == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
        said = "cannot reach the s3:// endpoint"
    else:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        said = "no credentials found"
    p = tokenize(kjv, out, "--workers", "1", cache=tmp_path / "c")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"dataflow tokenize: error: {out}: ") and said in p.stderr, p.stderr
