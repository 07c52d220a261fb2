"""A tokenize whose output folder is (or lies in) a folder of its inputs never reads its own output as input:
its shards, index.json, the tokenizer's copy, the error log and _work/ are left out of the listing, so a rerun
says the dataset is complete (or resumes it) instead of being refused for the files it wrote itself. Other files
in that folder stay inputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest
import zstandard

from support import kill_points
from support.data import GPT2_JSON
from support.cli import DATAFLOW
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`

ARGS = ["--no-progress", "--workers", "1"]


def kjv_lines(kjv) -> list[bytes]:
    with open(kjv, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)


def tokenize(*args, cwd=None) -> subprocess.CompletedProcess:
    return run_dataflow("tokenize", *args, *ARGS, cwd=cwd, env=dict(os.environ, PYTHONPATH=os.getcwd()))


def every_file(folder) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {os.path.relpath(os.path.join(root, n), folder): hashlib.sha256(open(os.path.join(root, n), "rb").read())
            .hexdigest() for root, _, names in os.walk(folder) for n in names}


def documents(p: subprocess.CompletedProcess) -> int:
    """The documents of the dataset, as its summary's `train:` and `val:` lines count them."""
    return sum(int(line.split(": ", 1)[1].split(" document", 1)[0].replace(",", ""))
               for line in p.stdout.splitlines() if line.startswith(("  train: ", "  val: ")))


@pytest.fixture
def folder(kjv, tmp_path):
    """A folder of inputs: 150 KJV lines in in.jsonl and 7 more in notes.jsonl (a file of the user's), and the
    GPT-2 tokenizer as tokenizer.json (what the run copies into its output too)."""
    lines = kjv_lines(kjv)
    src = tmp_path / "d"
    src.mkdir()
    (src / "in.jsonl").write_bytes(b"".join(lines[:150]))
    (src / "notes.jsonl").write_bytes(b"".join(lines[150:157]))
    shutil.copy(GPT2_JSON, tmp_path / "tok.json")
    return src


@pytest.mark.parametrize("out, extra", [(".", []), ("sub", []), (".", ["--val-fraction", "0.2"]),
                                        ("sub/deeper", ["--format", "tar"])])
def test_a_rerun_into_its_input_folder_is_complete_with_the_same_bytes(folder, out, extra):
    first = tokenize(folder, "-o", folder / out, "--tokenizer", "../tok.json", *extra, cwd=folder)
    assert first.returncode == 0, first.stderr
    assert documents(first) == 157  # both files of the user's, nothing else
    made = every_file(folder)
    again = tokenize(folder, "-o", folder / out, "--tokenizer", "../tok.json", *extra, cwd=folder)
    assert again.returncode == 0 and "already complete: nothing to do" in again.stdout, again.stderr
    assert every_file(folder) == made


def test_a_glob_that_matches_the_runs_own_json_files_leaves_them_out(folder):
    """`d/*.json*` matches index.json, tokenizer.json and _errors.jsonl of a run into d."""
    pattern = str(folder / "*.json*")
    assert tokenize(pattern, "-o", folder, "--tokenizer", folder.parent / "tok.json").returncode == 0
    made = every_file(folder)
    again = tokenize(pattern, "-o", folder, "--tokenizer", folder.parent / "tok.json")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr
    assert every_file(folder) == made


def test_a_file_the_user_adds_beside_the_output_is_still_an_input(folder):
    assert tokenize(folder, "-o", folder, "--tokenizer", folder.parent / "tok.json").returncode == 0
    (folder / "more.jsonl").write_text(json.dumps({"text": "one more document"}) + "\n")
    p = tokenize(folder, "-o", folder, "--tokenizer", folder.parent / "tok.json")
    assert p.returncode == 2 and "other input files (added more.jsonl)" in p.stderr, p.stderr


def test_an_interrupted_run_into_its_input_folder_resumes_to_a_fresh_runs_bytes(kjv, tmp_path):
    """The journal of _work/ (journal.json, inputs.json: JSON names) is no input of the resume."""
    src = tmp_path / "d"
    src.mkdir()
    (src / "in.jsonl").write_bytes(b"".join(kjv_lines(kjv)[:1500]))
    small = ["--unit-size", "64KB", "--shard-size", "64KB"]
    fresh = tokenize(src / "in.jsonl", "-o", tmp_path / "fresh", *small)
    assert fresh.returncode == 0, fresh.stderr
    p = subprocess.run(kill_points.command({"next_unit": 3}, "tokenize", src, "-o", src, *small, *ARGS),
                       capture_output=True, text=True)
    assert p.returncode < 0, p.stderr  # it got there, and died there
    assert json.loads((src / "_work" / "task-00000" / "journal.json").read_text())["next_unit"] == 3
    resumed = tokenize(src, "-o", src, *small)
    assert resumed.returncode == 0 and "resumed at unit 3 of" in resumed.stdout, resumed.stderr
    assert documents(resumed) == documents(fresh)
    ours = {k: v for k, v in every_file(src).items() if k != "in.jsonl"}
    theirs = every_file(tmp_path / "fresh")
    ours.pop("index.json"), theirs.pop("index.json")  # it holds the run's time: its shards are compared below
    assert ours == theirs
    a, b = (json.loads((f / "index.json").read_text()) for f in (src, tmp_path / "fresh"))
    assert a["shards"] == b["shards"]


def test_a_folder_that_holds_only_the_runs_output_is_one_line(folder):
    out = folder / "ds"
    assert tokenize(folder / "in.jsonl", "-o", out).returncode == 0
    p = tokenize(out, "-o", out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "holds only what this run writes" in p.stderr


def test_an_object_store_prefix_that_is_input_and_output_reruns_as_complete(kjv, tmp_path):
    """The same on S3 (moto's server): the run's objects under the prefix, however the prefix is spelled."""
    from support.s3_server import moto_s3

    with moto_s3("own", endpoint_env=True) as (_, client):
        client.put_object(Bucket="own", Key="mix/in.jsonl", Body=b"".join(kjv_lines(kjv)[:120]))
        env = dict(os.environ, DATAFLOW_CACHE=str(tmp_path / "cache"), PYTHONPATH=os.getcwd())

        def run(out):
            return subprocess.run([*DATAFLOW, "tokenize", "s3://own/mix", "-o", out, *ARGS], capture_output=True,
                                  text=True, env=env)

        first = run("s3://own/mix")
        assert first.returncode == 0 and documents(first) == 120, first.stderr
        keys = {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket="own", Prefix="mix/")["Contents"]}
        assert "mix/index.json" in keys and "mix/_errors.jsonl" in keys
        for spelling in ("s3://own/mix", "s3://own/mix/", "s3://own//mix"):
            again = run(spelling)
            assert again.returncode == 0 and "already complete" in again.stdout, (spelling, again.stderr)
        assert {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket="own", Prefix="mix/")["Contents"]} == keys


def test_task_slices_and_their_merge_in_the_input_folder(folder):
    """Task 1 lists the folder after task 0 wrote its part there; after the merge every task reruns as done."""
    tasks = ["--num-tasks", "2", "--unit-size", "64KB"]
    for i in (0, 1):
        p = tokenize(folder, "-o", folder, *tasks, "--task-index", i)
        assert p.returncode == 0, p.stderr
    assert subprocess.run([*DATAFLOW, "merge", str(folder)], capture_output=True).returncode == 0
    made = every_file(folder)
    assert json.loads((folder / "index.json").read_text())["totals"]["documents"] == 157
    for i in (0, 1):
        p = tokenize(folder, "-o", folder, *tasks, "--task-index", i)
        assert p.returncode == 0 and "already complete" in p.stdout, p.stderr
    assert every_file(folder) == made
