"""A tokenize run removes only what a journal or manifest of its own lists: a fresh run writes beside other
files and refuses (exit 2) a name it must write that another file holds; --overwrite replaces a dataset of ours,
never other files; a resume removes the shards its journal claimed, nothing else. On an object store the run
lock is the prefix's however it is spelled, and the commit checks that every shard object is the one it uploaded."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time

import pytest
import zstandard

from support import kill_points
from support.s3_server import moto_s3
from support.cli import DATAFLOW, dataset_bytes
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`

ARGS = ["--no-progress", "--unit-size", "256KB", "--shard-size", "128KB"]


@pytest.fixture(scope="module")
def lines(kjv) -> list[bytes]:
    with open(kjv, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)


def tokenize(*args, cache=None):
    env = dict(os.environ, **({"DATAFLOW_CACHE": str(cache)} if cache else {}))
    return run_dataflow("tokenize", *args, *ARGS, env=env)


def files_of(folder) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256)."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            path = os.path.join(root, n)
            out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def test_a_fresh_run_writes_beside_other_files_its_input_among_them(tmp_path, lines):
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-data.jsonl").write_bytes(b"".join(lines[:300]))  # the input, named like a shard
    (out / "notes.txt").write_text("mine")
    (out / "shard-notes.txt").write_text("mine too")
    (out / "train").mkdir()
    (out / "train" / "README").write_text("a folder of mine")
    before = files_of(out)
    p = tokenize(out / "shard-data.jsonl", "-o", out, "--val-fraction", "0.1")
    assert p.returncode == 0, p.stderr
    assert {k: v for k, v in files_of(out).items() if k in before} == before
    assert subprocess.run([*DATAFLOW, "verify", out / "train", "--no-progress"]).returncode == 0
    # --overwrite with other settings replaces our dataset, in both layouts, and nothing else
    p = tokenize(out / "shard-data.jsonl", "-o", out, "--overwrite", "--no-eos")
    assert p.returncode == 0, p.stderr
    assert {k: v for k, v in files_of(out).items() if k in before} == before
    assert not (out / "val").exists() and not (out / "train" / "index.json").exists()
    assert json.loads((out / "index.json").read_text())["provenance"]["settings"]["eos"] is False


@pytest.mark.parametrize("name", ["shard-00000.arrow", "shard-00003.tar.zst", "index.json", "_errors.jsonl",
                                  "_work", "train/shard-00000.arrow"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_name_the_run_writes_held_by_another_file_is_refused(tmp_path, lines, name, overwrite):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:100]))
    out = tmp_path / "out"
    (out / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
    (out / name).write_text('{"not": "a manifest"}' if name == "index.json" else "someone else's")
    before = files_of(out)
    split = ["--val-fraction", "0.1"] if name.startswith("train/") else []
    p = tokenize(src, "-o", out, *split, *(["--overwrite"] if overwrite else []))
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and str(out / name) in p.stderr.replace("/./", "/")
    assert files_of(out) == before and sorted(os.listdir(out)) == sorted(before_top(before))


def before_top(files: dict[str, str]) -> set[str]:
    return {k.split(os.sep)[0] for k in files}


def test_overwrite_refuses_a_shard_no_manifest_lists_and_removes_nothing(tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:300]))
    out = tmp_path / "out"
    assert tokenize(src, "-o", out).returncode == 0
    (out / "shard-00042.arrow").write_text("not ours")
    before = files_of(out)
    p = tokenize(src, "-o", out, "--no-eos", "--overwrite")
    assert p.returncode == 2 and "shard-00042.arrow" in p.stderr
    assert files_of(out) == before


def test_a_resume_removes_the_shards_its_journal_claimed_and_refuses_others(tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines))
    assert tokenize(src, "-o", tmp_path / "ref", "--workers", "1").returncode == 0
    out = tmp_path / "killed"
    cmd = kill_points.command({"renamed": 6}, "tokenize", src, "-o", out, "--workers", "1", *ARGS)
    assert subprocess.run(cmd, capture_output=True).returncode == -signal.SIGKILL
    journal = json.loads((out / "_work" / "task-00000" / "journal.json").read_text())
    listed = {s["path"] for s in journal["shards"]["train"]}
    in_place = {n for n in os.listdir(out) if n.startswith("shard-")}
    unlisted = sorted(in_place - listed)
    assert unlisted and all(int(n[6:11]) < journal["claimed"]["train"] for n in unlisted)  # claimed first
    stranger = out / f"shard-{journal['claimed']['train'] + 5:05d}.arrow"
    stranger.write_text("not ours")
    p = tokenize(src, "-o", out, "--workers", "1")
    assert p.returncode == 2 and stranger.name in p.stderr and set(unlisted) <= set(os.listdir(out))
    stranger.unlink()
    assert tokenize(src, "-o", out, "--workers", "2").returncode == 0
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


@pytest.fixture(scope="module")
def s3():
    with moto_s3("own", endpoint_env=True) as (_, client):
        yield client


def keys(s3, prefix: str) -> dict[str, str]:
    listed = s3.list_objects_v2(Bucket="own", Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def test_on_s3_a_fresh_run_keeps_other_objects_and_refuses_one_in_its_names(s3, tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:300]))
    s3.put_object(Bucket="own", Key="a/notes.txt", Body=b"mine")
    s3.put_object(Bucket="own", Key="a/shard-notes.txt", Body=b"mine too")
    assert tokenize(src, "-o", "s3://own/a", cache=tmp_path / "c").returncode == 0
    assert {"a/notes.txt", "a/shard-notes.txt", "a/index.json"} <= set(keys(s3, "a/"))
    p = tokenize(src, "-o", "s3://own/a", "--no-eos", "--overwrite", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    assert {"a/notes.txt", "a/shard-notes.txt"} <= set(keys(s3, "a/"))
    s3.put_object(Bucket="own", Key="b/shard-00000000-000000-00000.arrow", Body=b"someone else's")
    before = keys(s3, "b/")
    for extra in ([], ["--overwrite"]):
        p = tokenize(src, "-o", "s3://own/b", *extra, cache=tmp_path / "c")
        assert p.returncode == 2 and "s3://own/b/shard-00000000-000000-00000.arrow" in p.stderr, p.stderr
        assert keys(s3, "b/") == before


def test_on_s3_runs_into_one_prefix_spelled_otherwise_exclude_each_other(s3, tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:300]))
    marker, go = tmp_path / "paused", tmp_path / "go"
    env = dict(os.environ, DATAFLOW_CACHE=str(tmp_path / "c"))
    first = subprocess.Popen(kill_points.command({"pause": [str(marker), str(go)]}, "tokenize", src, "-o",
                                                 "s3://own/lk", *ARGS), env=env, stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists():
            assert first.poll() is None, first.communicate()
            time.sleep(0.02)
        for spelling in ("s3://own/lk/", "s3://own//lk", "s3://own/./lk"):
            p = tokenize(src, "-o", spelling, cache=tmp_path / "c")
            assert p.returncode == 2 and "another `dataflow tokenize` is writing" in p.stderr, (spelling, p.stderr)
        go.touch()
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_on_s3_the_commit_refuses_a_shard_another_run_replaced(s3, tmp_path, lines, monkeypatch, how):
    """Another run (from another machine, where no lock reaches) writes the prefix between our upload and our
    manifest: the manifest is not written, and the run says why."""
    from dataflow.errors import DataflowError
    from dataflow.preprocess import commit
    from dataflow.preprocess.run import TokenizeConfig, tokenize as run_tokenize

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:600]))
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "c"))
    commit_bundle = commit.commit_bundle

    def meanwhile(result, *args, **kwargs):
        commit_bundle(result, *args, **kwargs)
        for shard in result.shards.get("train", [])[:1]:
            key = f"{how}/{shard.path}"
            if how == "removed":
                s3.delete_object(Bucket="own", Key=key)
            else:  # the same size, other bytes
                size = len(s3.get_object(Bucket="own", Key=key)["Body"].read())
                s3.put_object(Bucket="own", Key=key, Body=b"x" * size)

    monkeypatch.setattr(commit, "commit_bundle", meanwhile)
    cfg = TokenizeConfig(inputs=[str(src)], out=f"s3://own/{how}", shard_size="128KB", unit_bytes=256 << 10,
                         workers=1, progress=False)
    with pytest.raises(DataflowError, match="another run is writing"):
        run_tokenize(cfg)
    assert f"{how}/index.json" not in keys(s3, f"{how}/")


def test_on_s3_a_stop_at_the_very_end_keeps_the_error_log(s3, tmp_path, lines):
    """Killed after the manifests and the error log are uploaded, before the journal goes: the rerun keeps the
    log as it was (it once replaced it with NUL bytes), also when its local copy was lost meanwhile."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(lines[:200]) + b"not json\n" + b'{"text": 5}\n' + b"".join(lines[200:400]))
    assert tokenize(src, "-o", "s3://own/ref", cache=tmp_path / "c").returncode == 0
    ref = s3.get_object(Bucket="own", Key="ref/_errors.jsonl")["Body"].read()
    assert ref.count(b"\n") == 2
    env = dict(os.environ, DATAFLOW_CACHE=str(tmp_path / "c"))
    for out, lose_local in (("end", False), ("lost", True)):
        cmd = kill_points.command({"finished": True}, "tokenize", src, "-o", f"s3://own/{out}", *ARGS)
        assert subprocess.run(cmd, capture_output=True, env=env).returncode == -signal.SIGKILL
        if lose_local:
            for root, _, names in os.walk(tmp_path / "c" / "tokenize-work"):
                for n in names:
                    if n == "_errors.jsonl":
                        os.remove(os.path.join(root, n))
        p = tokenize(src, "-o", f"s3://own/{out}", cache=tmp_path / "c")
        assert p.returncode == 0, p.stderr
        assert s3.get_object(Bucket="own", Key=f"{out}/_errors.jsonl")["Body"].read() == ref
