"""A rerun over inputs that changed since the run it resumes (files added, removed or resized; a val split
added or dropped) is refused in one line rather than shifting units under the journal, unless the change lies
after everything committed; --overwrite clears what the other layout left."""

from __future__ import annotations

import json
import subprocess

import pytest
import zstandard

from support import kill_points
from support.cli import DATAFLOW, dataset_bytes
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`

ARGS = ["--no-progress", "--unit-size", "64KB", "--shard-size", "64KB", "--workers", "1"]


@pytest.fixture
def folder(kjv, tmp_path):
    """KJV as b.jsonl and c.jsonl (a.jsonl, made by a test, sorts first; d.jsonl last)."""
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    src = tmp_path / "in"
    src.mkdir()
    (src / "b.jsonl").write_bytes(b"".join(lines[:600]))
    (src / "c.jsonl").write_bytes(b"".join(lines[600:]))
    return src, lines


def tokenize(*args, check=False):
    return run_dataflow("tokenize", *args, check=check)


def killed_at(unit, src, out):
    p = subprocess.run(kill_points.command({"next_unit": unit}, "tokenize", src, "-o", out, *ARGS), capture_output=True)
    assert p.returncode < 0, p.stderr  # it got there, and died there
    assert json.loads((out / "_work" / "task-00000" / "journal.json").read_text())["next_unit"] == unit


@pytest.mark.parametrize("where", ["before", "resized"])
def test_a_change_under_the_committed_units_is_refused(folder, tmp_path, where):
    src, lines = folder
    killed_at(20, src, tmp_path / "out")
    if where == "before":  # sorts before b.jsonl: every unit after it would shift
        (src / "a.jsonl").write_bytes(b"".join(lines[:300]))
        said = "added a.jsonl"
    else:
        (src / "b.jsonl").write_bytes(b"".join(lines[1:600]))
        said = "resized b.jsonl"
    p = tokenize(src, "-o", tmp_path / "out", *ARGS)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"holds work made from other input files ({said}); pass --overwrite" in p.stderr


def edited_in_place(path):
    """The same bytes but one letter, so the file keeps its size (a fix made with `sed -i`, say)."""
    data = path.read_bytes()
    at = data.index(b"LORD")
    path.write_bytes(data[:at] + b"Lord" + data[at + 4:])


def test_a_file_edited_in_place_under_the_committed_units_is_refused(folder, tmp_path):
    src, _ = folder
    killed_at(20, src, tmp_path / "out")  # b.jsonl is read whole by then
    edited_in_place(src / "b.jsonl")
    p = tokenize(src, "-o", tmp_path / "out", *ARGS)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "b.jsonl: written again since the interrupted run" in p.stderr and "--overwrite" in p.stderr, p.stderr
    tokenize(src, "-o", tmp_path / "out", *ARGS, "--overwrite", check=True)
    tokenize(src, "-o", tmp_path / "ref", *ARGS, check=True)
    assert dataset_bytes(tmp_path / "out") == dataset_bytes(tmp_path / "ref")


def test_a_file_edited_in_place_after_the_committed_units_resumes_to_a_fresh_runs_bytes(folder, tmp_path):
    src, lines = folder
    (src / "d.jsonl").write_bytes(b"".join(lines[:300]).replace(b'"id": "', b'"id": "d-'))
    killed_at(3, src, tmp_path / "out")  # in b.jsonl: nothing of d.jsonl read yet
    edited_in_place(src / "d.jsonl")
    assert tokenize(src, "-o", tmp_path / "out", *ARGS).returncode == 0
    tokenize(src, "-o", tmp_path / "ref", *ARGS, check=True)
    assert dataset_bytes(tmp_path / "out") == dataset_bytes(tmp_path / "ref")


def test_a_file_added_after_the_committed_units_resumes_to_a_fresh_runs_bytes(folder, tmp_path):
    src, lines = folder
    killed_at(20, src, tmp_path / "out")
    (src / "d.jsonl").write_bytes(b"".join(lines[:300]).replace(b'"id": "', b'"id": "d-'))
    assert tokenize(src, "-o", tmp_path / "out", *ARGS).returncode == 0
    tokenize(src, "-o", tmp_path / "ref", *ARGS, check=True)
    assert dataset_bytes(tmp_path / "out") == dataset_bytes(tmp_path / "ref")


def test_the_same_files_named_otherwise_resume_and_a_new_file_after_a_finished_run_is_refused(folder, tmp_path,
                                                                                             monkeypatch):
    src, lines = folder
    killed_at(20, src, tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    p = tokenize("./in/../in/b.jsonl", "in/c.jsonl", "-o", tmp_path / "out", *ARGS, "--max-errors", "5")
    assert p.returncode == 0, p.stderr  # spelled otherwise, listed instead of a folder, another --max-errors
    (src / "d.jsonl").write_bytes(b"".join(lines[:10]))
    p = tokenize(src, "-o", tmp_path / "out", *ARGS)  # finished: it must not answer "already complete"
    assert p.returncode == 2 and "other input files (added d.jsonl)" in p.stderr, p.stderr


@pytest.mark.parametrize("first,then", [([], ["--val-fraction", "0.1"]), (["--val-fraction", "0.1"], [])])
def test_adding_or_dropping_the_val_split_is_refused_and_overwrite_leaves_nothing_of_the_other_layout(
        folder, tmp_path, first, then):
    src, _ = folder
    out = tmp_path / "out"
    tokenize(src, "-o", out, *ARGS, *first, check=True)
    p = tokenize(src, "-o", out, *ARGS, *then)
    assert p.returncode == 2 and "other settings (val_fraction)" in p.stderr, p.stderr
    tokenize(src, "-o", out, *ARGS, *then, "--overwrite", check=True)
    tokenize(src, "-o", tmp_path / "ref", *ARGS, *then, check=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


def test_a_single_run_into_a_folder_of_task_slices_is_refused(folder, tmp_path):
    # a later `merge` would list the slices in the index.json this run writes, over it
    src, _ = folder
    out = tmp_path / "out"
    tokenize(src, "-o", out, *ARGS, "--num-tasks", "2", "--task-index", "0", check=True)
    p = tokenize(src, "-o", out, *ARGS)
    assert p.returncode == 2 and f"{out} holds the task slices of a --num-tasks run (part-00000)" in p.stderr, p.stderr
    tokenize(src, "-o", out, *ARGS, "--num-tasks", "2", "--task-index", "1", check=True)  # the slices go on


@pytest.mark.parametrize("merged", [False, True])
def test_overwrite_replaces_task_slices_with_a_single_runs_dataset(folder, tmp_path, merged):
    src, _ = folder
    out = tmp_path / "out"
    for k in range(2):
        tokenize(src, "-o", out, *ARGS, "--num-tasks", "2", "--task-index", str(k), check=True)
    if merged:
        subprocess.run([*DATAFLOW, "merge", str(out)], check=True, capture_output=True)
    (out / "notes.txt").write_text("mine")  # not a name a run writes: stays
    p = tokenize(src, "-o", out, *ARGS, "--overwrite")  # refused before: "run `dataflow merge` on them"
    assert p.returncode == 0, p.stderr
    tokenize(src, "-o", tmp_path / "ref", *ARGS, check=True)
    got = dataset_bytes(out)
    assert got.pop("notes.txt") == b"mine" and got == dataset_bytes(tmp_path / "ref")
    left = sorted(str(f.relative_to(out)) for f in out.rglob("*"))
    assert left == sorted(["notes.txt", *(f.name for f in (tmp_path / "ref").iterdir())]), left  # no slice left


def test_overwrite_of_task_slices_holding_a_file_not_ours_removes_nothing(folder, tmp_path):
    src, _ = folder
    out = tmp_path / "out"
    for k in range(2):
        tokenize(src, "-o", out, *ARGS, "--num-tasks", "2", "--task-index", str(k), check=True)
    (out / "part-00001" / "shard-00099.arrow").write_bytes(b"someone else's")
    before = sorted(out.rglob("*"))
    p = tokenize(src, "-o", out, *ARGS, "--overwrite")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "part-00001/shard-00099.arrow" in p.stderr, p.stderr
    assert sorted(out.rglob("*")) == before
