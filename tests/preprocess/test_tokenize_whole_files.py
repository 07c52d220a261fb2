"""Many compressed JSONL files: each goes to a worker whole, which cuts it into the pieces the coordinator
would have cut, so that no single process decompresses the whole corpus (nor, with Ray, ships it) and the
bytes stay those of any other run: plain files, fewer files than workers (the coordinator cuts), a resume."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
from pathlib import Path

import pytest
import zstandard

from support import kill_points
from support.data import GPT2_JSON
from dataflow.preprocess.run import TokenizeConfig, tokenize
from support.cli import same_data
from support.kill_points import kill_at_pieces
from support.cli import tokenize_small
from support.executors import local_and_ray_shards
from support.cli import dataset_bytes

FILES = 4
pieces_module = importlib.import_module("dataflow.sources.pieces")  # (the package's `pieces` is
# the function of that name)


@pytest.fixture(scope="module")
def parts(kjv, tmp_path_factory) -> Path:
    """The first 600 KJV documents as 4 files, each as .jsonl (folder plain/) and .jsonl.zst (zst/), with a
    bad record inside the third."""
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)[:600]
    lines.insert(370, b"not json\n")
    root = tmp_path_factory.mktemp("parts")
    for kind in ("plain", "zst"):
        (root / kind).mkdir()
    step = -(-len(lines) // FILES)
    for k in range(FILES):
        data = b"".join(lines[k * step:(k + 1) * step])
        (root / "plain" / f"part-{k}.jsonl").write_bytes(data)
        (root / "zst" / f"part-{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    return root


def _cutters(tmp_path: Path, monkeypatch) -> Path:
    """A file that gets the pid, parent pid and process name of every process that cuts a compressed stream
    (forked workers too)."""
    log = tmp_path / "cutters"
    original = pieces_module._cut

    def logged(*args):
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {os.getppid()} {multiprocessing.current_process().name}\n")
        yield from original(*args)

    monkeypatch.setattr(pieces_module, "_cut", logged)
    return log


def test_the_workers_cut_many_compressed_files_and_the_bytes_are_those_of_the_coordinators_cut(
        tmp_path, parts, monkeypatch):
    settings = dict(tokenizer=str(GPT2_JSON), unit_bytes=64 << 10, shard_size="256KB", progress=False)
    tokenize(TokenizeConfig(inputs=[str(parts / "plain")], out=str(tmp_path / "plain"), workers=1, **settings))
    log = _cutters(tmp_path, monkeypatch)
    # 4 files for 1 worker: each file goes to the worker whole; for 3 workers, too few: the coordinator cuts them,
    # in the one process it starts for that (readers/cut_process.py)
    for workers in (1, 3):
        log.unlink(missing_ok=True)
        tokenize(TokenizeConfig(inputs=[str(parts / "zst")], out=str(tmp_path / f"zst{workers}"), workers=workers,
                                **settings))
        cutters = [line.split() for line in log.read_text().splitlines()]
        assert len(cutters) == FILES and all(pid != str(os.getpid()) for pid, _, _ in cutters)
        by_the_coordinator = {(ppid, name) for _, ppid, name in cutters} == {(str(os.getpid()), "dataflow-cut")}
        assert by_the_coordinator == (workers == 3), (workers, cutters)
        assert workers == 1 or len({pid for pid, _, _ in cutters}) == 1
        assert same_data(tmp_path / f"zst{workers}") == same_data(tmp_path / "plain")
    errors = {out: [(e["file"].rsplit("/", 1)[-1].removesuffix(".zst"), e["line"]) for e in map(
        json.loads, (tmp_path / out / "_errors.jsonl").read_text().splitlines())] for out in ("plain", "zst1", "zst3")}
    assert errors["zst1"] == errors["zst3"] == errors["plain"] == [("part-2.jsonl", 69)]


def test_a_kill_9_in_the_middle_of_a_file_a_worker_reads_whole_resumes_to_the_same_bytes(tmp_path, parts):
    src = parts / "zst"
    tokenize_small(src, tmp_path / "ref", "--workers", "1", "--no-progress", "--unit-size", "128KB")  # 5 pieces a file
    out = tmp_path / "killed"
    journal = out / "_work" / "task-00000" / "journal.json"
    args = ["tokenize", src, "-o", out, "--no-progress", "--shard-size", "512KB", "--unit-size", "128KB",
            "--workers", "1"]
    kill_at_pieces(args, journal, (2, 4))  # inside the first file, which the worker reads whole
    tokenize_small(src, out, "--workers", "1", "--no-progress", "--unit-size", "128KB")
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert not (out / "_work").exists()


@pytest.mark.timing  # the 2 s bound on the stop is wall-clock, on a shared machine
def test_ctrl_c_while_a_worker_reads_a_file_whole_stops_at_once_and_the_rerun_resumes(tmp_path, parts):
    """Ctrl-C (SIGINT to the process group) while the worker holds the third file: `interrupted`, exit 130
    within 2 s; the journal stays, and the rerun gives the bytes of a clean run."""
    args = ["tokenize", parts / "zst", "--no-progress", "--shard-size", "512KB", "--unit-size", "128KB",
            "--workers", "1"]  # (tokenize_small() below: the same settings)
    out = tmp_path / "out"
    code, err, took = kill_points.ctrl_c_while_holding(2, tmp_path / "holding", *args, "-o", out)
    assert code == 130 and err.strip() == "dataflow tokenize: interrupted", err
    assert took < 2, took
    assert (out / "_work" / "task-00000" / "journal.json").exists()  # (how far it got is a matter of timing)
    tokenize_small(parts / "zst", out, "--workers", "1", "--no-progress", "--unit-size", "128KB")
    tokenize_small(parts / "zst", tmp_path / "ref", "--workers", "1", "--no-progress", "--unit-size", "128KB")
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


def test_a_damaged_file_read_whole_by_a_worker_is_one_line_naming_it(tmp_path, parts):
    src = tmp_path / "zst"
    src.mkdir()
    for f in (parts / "zst").iterdir():
        data = f.read_bytes()
        if f.name == "part-1.jsonl.zst":
            data = data[:len(data) // 2] + b"\x00" * 64 + data[len(data) // 2 + 64:]
        (src / f.name).write_bytes(data)
    p = tokenize_small(src, tmp_path / "out", "--workers", "1", "--no-progress", check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and "part-1.jsonl.zst" in p.stderr and "damaged compressed stream" in p.stderr
    # the first file is committed; nothing of the damaged one is, and no shard of it is left lying about
    assert json.loads((tmp_path / "out" / "_work" / "task-00000" / "journal.json").read_text())["next_unit"] == 1
    assert not list((tmp_path / "out" / "_work").rglob("unit-00000001-*"))


@pytest.mark.heavy  # a Ray cluster in-process (make test-all)
def test_ray_tasks_read_many_compressed_files_themselves(tmp_path, parts, monkeypatch):
    """The driver neither decompresses nor ships the files: each task reads its own, and the shards are those
    of the local pool."""
    def no_cutting_here(*args, **kwargs):
        raise AssertionError("the driver cut a compressed file")

    def before_ray():  # (the local pool's forked workers cut their files with this module's `pieces`)
        monkeypatch.setattr(pieces_module, "pieces", no_cutting_here)  # Ray's workers import their own copy

    local, ray = local_and_ray_shards(tmp_path, before_ray, inputs=[str(parts / "zst")], tokenizer=str(GPT2_JSON),
                                      unit_bytes=64 << 10, workers=2, shard_size="64KB", progress=False)
    assert local == ray and len(local) > 4
