"""Preprocessing at scale: determinism across workers, kill -9 and resume, task slices, Ray."""

import json
import signal
import subprocess
import time

import pytest
import zstandard

from support import kill_points
from support.cli import DATAFLOW, dataset_bytes


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, kjv):
    """KJV as uneven plain JSONL files: a big one cut into many units, then small ones."""
    src = tmp_path_factory.mktemp("corpus")
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    (src / "a.jsonl").write_bytes(b"".join(lines[:900]))
    (src / "b.jsonl").write_bytes(b"".join(lines[900:1000]))
    (src / "c.jsonl").write_bytes(b"".join(lines[1000:]))
    return src


def tokenize(src, out, *extra, check=True):
    args = [*DATAFLOW, "tokenize", str(src), "-o", str(out), "--no-progress", "--shard-size", "512KB",
            "--unit-size", "256KB", *map(str, extra)]
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(p.stderr)
    return p


def test_output_identical_for_1_and_2_workers(corpus, tmp_path):
    tokenize(corpus, tmp_path / "w1", "--workers", "1", "--val-fraction", "0.05")
    p = tokenize(corpus, tmp_path / "w2", "--workers", "2", "--val-fraction", "0.05", "--json")
    summary = json.loads(p.stdout)
    assert summary["units"] >= 8 and summary["datasets"]["train"]["shards"] >= 3
    a, b = dataset_bytes(tmp_path / "w1"), dataset_bytes(tmp_path / "w2")
    assert a.keys() == b.keys() and a == b


def test_kill_9_and_resume_gives_identical_bytes(corpus, tmp_path):
    reference = tmp_path / "ref"
    tokenize(corpus, reference, "--workers", "2", "--val-fraction", "0.05")
    out = tmp_path / "killed"
    args = ["tokenize", corpus, "-o", out, "--no-progress", "--shard-size", "512KB", "--unit-size", "256KB",
            "--workers", "2", "--val-fraction", "0.05"]
    journal = out / "_work" / "task-00000" / "journal.json"
    for units in (3, 8, 14):  # each run resumes the one before and is killed once it has committed this many
        p = subprocess.run(kill_points.command({"next_unit": units}, *args), capture_output=True, text=True)
        assert p.returncode == -signal.SIGKILL, p.stderr
        assert json.loads(journal.read_text())["next_unit"] == units
        assert not _orphans(f"tokenize {corpus} -o {out}"), "worker processes outlived the killed run"
    p = tokenize(corpus, out, "--workers", "1", "--val-fraction", "0.05", "--json")
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert not (out / "_work").exists()
    assert json.loads(p.stdout)["resumed_from_unit"] == 14


def _orphans(pattern: str, wait_s: float = 30) -> list[str]:
    """Processes whose command line holds `pattern`, once they had `wait_s` to exit (workers die with their
    parent at once; the wait only covers a loaded machine)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def kill_once_committed(corpus, out, units):
    """Run with 1 worker, killed -9 once its journal has committed `units` units; returns the journal."""
    p = subprocess.run(kill_points.command({"next_unit": units}, "tokenize", corpus, "-o", out, "--no-progress",
                                           "--shard-size", "512KB", "--unit-size", "256KB", "--workers", "1"),
                       capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    return out / "_work" / "task-00000" / "journal.json"


def test_committed_units_are_not_redone(corpus, tmp_path):
    out = tmp_path / "o"
    journal = kill_once_committed(corpus, out, 5)
    done = json.loads(journal.read_text())["next_unit"]
    summary = json.loads(tokenize(corpus, out, "--workers", "1", "--json").stdout)
    assert summary["resumed_from_unit"] == done >= 5


def test_a_journal_of_another_version_is_refused_not_misread(corpus, tmp_path):
    out = tmp_path / "o"
    journal = kill_once_committed(corpus, out, 1)
    old = json.loads(journal.read_text())
    old.pop("version")  # as the first journal format wrote it, with per-document spills
    journal.write_text(json.dumps(old))
    p = tokenize(corpus, out, "--workers", "1", check=False)
    assert p.returncode == 2 and "journal version 1" in p.stderr and "--overwrite" in p.stderr
    assert "Traceback" not in p.stderr
    assert tokenize(corpus, out, "--workers", "1", "--overwrite").returncode == 0


def test_task_slices_merge_to_the_single_run(corpus, tmp_path):
    single = tmp_path / "single"
    tokenize(corpus, single, "--workers", "2")
    sliced = tmp_path / "sliced"
    for i in (2, 0, 1):  # any order, as a Slurm array would
        p = tokenize(corpus, sliced, "--num-tasks", "3", "--task-index", i, "--workers", "1")
        assert "dataflow merge" in p.stdout
    merged = subprocess.run([*DATAFLOW, "merge", str(sliced)], capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    a = subprocess.run([*DATAFLOW, "decode", str(single)], capture_output=True, text=True).stdout
    b = subprocess.run([*DATAFLOW, "decode", str(sliced)], capture_output=True, text=True).stdout
    assert a == b and a.count("\n") == 1189
    assert subprocess.run([*DATAFLOW, "verify", str(sliced)]).returncode == 0
    index = json.loads((sliced / "index.json").read_text())
    assert all(s["path"].startswith("part-") for s in index["shards"])
    # tasks take whole bundles: the merged shards are the single run's shards, byte for byte, in order
    single_index = json.loads((single / "index.json").read_text())
    assert [s["sha256"] for s in index["shards"]] == [s["sha256"] for s in single_index["shards"]]


def test_merge_names_missing_tasks(corpus, tmp_path):
    out = tmp_path / "o"
    tokenize(corpus, out, "--num-tasks", "3", "--task-index", "1", "--workers", "1")
    p = subprocess.run([*DATAFLOW, "merge", str(out)], capture_output=True, text=True)
    assert p.returncode == 1 and "part-00000" in p.stderr and "part-00002" in p.stderr


def test_tar_formats_round_trip(corpus, tmp_path):
    import webdataset as wds

    for comp in ("zstd", "none"):
        out = tmp_path / comp
        tokenize(corpus, out, "--format", "tar", "--compression", comp, "--workers", "2")
        assert subprocess.run([*DATAFLOW, "verify", str(out)]).returncode == 0
        text = subprocess.run([*DATAFLOW, "decode", str(out)], capture_output=True, text=True).stdout
        assert text.count("\n") == 1189 and "In the beginning God created" in text
    shard = sorted((tmp_path / "none").glob("shard-*.tar"))[0]
    assert len(list(wds.WebDataset(str(shard), shardshuffle=False))) > 0


@pytest.mark.heavy  # a Ray cluster in-process (make test-all)
def test_ray_executor_gives_the_same_bytes_and_returns_no_tokens(corpus, tmp_path, monkeypatch):
    import pickle

    import ray  # the dev extra installs it: this test must run in CI, never skip
    from dataflow.preprocess.run import TokenizeConfig, tokenize as run_tokenize

    tokenize(corpus, tmp_path / "local", "--workers", "2")
    returned = []
    real_get = ray.get

    def measured_get(refs, *args, **kwargs):
        value = real_get(refs, *args, **kwargs)
        returned.append(len(pickle.dumps(value)))
        return value

    monkeypatch.setattr(ray, "get", measured_get)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_tokenize(TokenizeConfig(inputs=[str(corpus)], out=str(tmp_path / "ray"), shard_size="512KB",
                                    unit_bytes=256 * 1024, workers=2, executor="ray", progress=False))
    finally:
        ray.shutdown()
    assert dataset_bytes(tmp_path / "ray") == dataset_bytes(tmp_path / "local")
    # tasks write their shards and hand back manifest entries: a few hundred bytes per 256KB bundle
    assert len(returned) >= 16 and max(returned) < 4096, returned


def test_the_unit_size_is_an_output_setting(corpus, tmp_path):
    """Shards end where bundles end, so a resume with another --unit-size is refused; the default does not
    depend on --workers (see test_tokenize_worker_shards)."""
    tokenize(corpus, tmp_path / "o", "--workers", "1")
    p = tokenize(corpus, tmp_path / "o", "--workers", "1", "--unit-size", "512KB", check=False)
    assert p.returncode == 2 and "unit_bytes" in p.stderr and "--overwrite" in p.stderr
