"""`dataflow merge` checks each part against its provenance before it lists a shard (the reliability issue's
item 8): every task 0..K-1 exactly once, in its own folder, their bundle ranges splitting the whole plan as
`--num-tasks K` does, and each part's shard files there with the sizes its manifest lists. Anything else is
refused in one line naming the part and what is wrong, and no merged manifest is written."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dataflow.cli import main

TASKS = 2


@pytest.fixture(scope="module")
def runs(kjv, tmp_path_factory):
    """The first 120 chapters of KJV (~430 KB, 7 bundles of 64KB) tokenized as 2 task slices and as 3."""
    import zstandard

    root = tmp_path_factory.mktemp("runs")
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)[:120]
    src = root / "kjv120.jsonl"
    src.write_bytes(b"".join(lines))
    for k in (TASKS, 3):
        for task in range(k):
            assert main(["tokenize", str(src), "-o", str(root / f"k{k}"), "--num-tasks", str(k), "--task-index",
                         str(task), "--unit-size", "64KB", "--shard-size", "32KB", "--no-progress"]) == 0
    return root


@pytest.fixture
def out(runs, tmp_path):
    """A fresh copy of the 2-task run, not yet merged."""
    shutil.copytree(runs / f"k{TASKS}", tmp_path / "out")
    return tmp_path / "out"


def part_manifest(out, task: int) -> dict:
    return json.loads((out / f"part-{task:05d}" / "index.json").read_text())


def edit_part(out, task: int, change) -> None:
    d = part_manifest(out, task)
    change(d)
    (out / f"part-{task:05d}" / "index.json").write_text(json.dumps(d))


def refused(capsys, out, *needles: str) -> str:
    capsys.readouterr()
    rc = main(["merge", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and all(n in err for n in needles), (rc, err)
    assert not (out / "index.json").exists()  # nothing committed
    return err


def test_the_parts_as_written_merge(out):
    assert main(["merge", str(out)]) == 0
    merged = [s["path"] for s in json.loads((out / "index.json").read_text())["shards"]]
    parts = [f"part-{t:05d}/{s['path']}" for t in range(TASKS) for s in part_manifest(out, t)["shards"]]
    assert merged == parts and len(parts) >= 4


def test_a_part_folder_holding_another_tasks_slice_is_refused(out, capsys):
    shutil.rmtree(out / "part-00001")
    shutil.copytree(out / "part-00000", out / "part-00001")  # task 0's slice twice: its documents duplicated
    refused(capsys, out, "part-00001", "holds the slice of task 0", "--task-index 1")


def test_a_part_missing_a_shard_file_is_refused(out, capsys):
    shard = part_manifest(out, 1)["shards"][-1]["path"]
    os.remove(out / "part-00001" / shard)
    refused(capsys, out, f"part-00001/{shard}", "missing", "--task-index 1")


def test_a_part_whose_shard_has_another_size_is_refused(out, capsys):
    shard = part_manifest(out, 0)["shards"][0]["path"]
    with open(out / "part-00000" / shard, "r+b") as f:
        f.truncate(100)
    refused(capsys, out, f"part-00000/{shard}", "100 bytes, its manifest says", "--task-index 0")


def test_a_part_left_by_a_run_of_more_tasks_is_refused(runs, out, capsys):
    """part-00002 of a 3-task run beside this 2-task run's parts: finished, or only begun."""
    shutil.copytree(runs / "k3" / "part-00002", out / "part-00002")
    refused(capsys, out, "part-00002", "no task of this 2-task run")
    os.remove(out / "part-00002" / "index.json")
    refused(capsys, out, "part-00002", "no task of this 2-task run")
    shutil.copytree(out / "part-00001", out / "part-00005")  # a copy of a part of this very run, renamed
    shutil.rmtree(out / "part-00002")
    refused(capsys, out, "part-00005", "no task of this 2-task run")


def test_a_part_made_by_a_run_with_other_settings_names_the_setting(runs, out, capsys):
    """Task 1 of the 3-task run put where task 1 of 2 belongs: its settings (and its slice) differ."""
    shutil.rmtree(out / "part-00001")
    shutil.copytree(runs / "k3" / "part-00001", out / "part-00001")
    refused(capsys, out, "part-00001", "num_tasks", "3", "2")


def test_a_part_whose_manifest_names_no_task_is_refused(out, capsys):
    edit_part(out, 1, lambda d: d["provenance"].pop("task"))
    refused(capsys, out, "part-00001", "names no task")


@pytest.mark.parametrize("bundles,needle", [
    (lambda lo, hi: [lo + 1, hi], "but part-00000's ends at bundle"),  # a gap after task 0's slice
    (lambda lo, hi: [lo - 1, hi], "but part-00000's ends at bundle"),  # overlapping it
    (lambda lo, hi: [lo, hi + 5], "do not split"),  # contiguous, but not the plan's split into 2 tasks
])
def test_bundle_ranges_that_do_not_split_the_plan_are_refused(out, capsys, bundles, needle):
    edit_part(out, 1, lambda d: d["provenance"]["task"].update(bundles=bundles(*d["provenance"]["task"]["bundles"])))
    refused(capsys, out, "part-00001", needle)
