"""`tokenize --overwrite` refused by a check removes nothing: the checks a run makes before its first write (the
tokenizer, the fields, task slices in the way) pass before the earlier dataset goes. Before, a typo in a flag
deleted the finished dataset, then exited 2 as a usage error. Real CLI, KJV."""

import os
import subprocess

import pytest

from support.cli import DATAFLOW
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`


def run(*args):
    return run_dataflow(*args, "--no-progress")


def files(folder):
    return sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names)


@pytest.fixture(scope="module")
def dataset(kjv, tmp_path_factory):
    out = tmp_path_factory.mktemp("ow") / "ds"
    p = run("tokenize", kjv, "-o", out, "--val-fraction", "0.1")
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize("bad", [["--text-field", "txt"], ["--tokenizer", "no-such-tokenizer.json"],
                                 ["--tokenizer", "tiktoken:{kjv}"]])
def test_a_refused_overwrite_leaves_the_dataset_as_it_was(dataset, kjv, bad):
    before = {f: (dataset / f).read_bytes() for f in files(dataset)}
    p = run("tokenize", kjv, "-o", dataset, "--val-fraction", "0.1", "--overwrite",
            *[b.format(kjv=kjv) for b in bad])
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert {f: (dataset / f).read_bytes() for f in files(dataset)} == before
    assert run("verify", dataset / "train").returncode == 0 and run("verify", dataset / "val").returncode == 0


def test_a_merged_dataset_survives_a_refused_single_run_overwrite(kjv, tmp_path):
    out = tmp_path / "q"
    for task in (0, 1):
        assert run("tokenize", kjv, "-o", out, "--num-tasks", "2", "--task-index", task).returncode == 0
    assert subprocess.run([*DATAFLOW, "merge", str(out)], capture_output=True).returncode == 0
    (out / "part-00001" / "shard-00099.arrow").write_bytes(b"not ours")  # an overwrite replaces the slices, but
    before = files(out)  # never what no manifest or journal of ours lists: refused, with nothing removed
    p = run("tokenize", kjv, "-o", out, "--overwrite")
    assert p.returncode == 2 and "part-00001/shard-00099.arrow: a file this run would write" in p.stderr, p.stderr
    (out / "part-00001" / "shard-00099.arrow").unlink()
    assert files(out) == [f for f in before if f != "part-00001/shard-00099.arrow"]
    assert run("verify", out).returncode == 0


def test_an_overwrite_that_passes_its_checks_replaces_the_dataset(dataset, kjv, tmp_path):
    p = run("tokenize", kjv, "-o", dataset, "--overwrite")  # no val split now: val/ goes
    assert p.returncode == 0, p.stderr
    assert not (dataset / "val").exists() and run("verify", dataset).returncode == 0


def test_task_slices_merged_over_a_single_run_replace_its_shards(kjv, tmp_path):
    """The merge of task slices written with --overwrite over a single run's dataset removes the shards that
    dataset listed (once its own index.json is in place): before, they stayed, listed by nothing, and a later
    --overwrite refused them as files no dataflow run wrote."""
    out = tmp_path / "o"
    assert run("tokenize", kjv, "-o", out).returncode == 0
    for task in (0, 1):
        p = run("tokenize", kjv, "-o", out, "--overwrite", "--num-tasks", "2", "--task-index", task)
        assert p.returncode == 0, p.stderr
    assert subprocess.run([*DATAFLOW, "merge", str(out)], capture_output=True).returncode == 0
    assert not [f for f in files(out) if f.startswith("shard-")] and run("verify", out).returncode == 0
