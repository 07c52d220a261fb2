"""One compressed JSONL file is cut by a process of its own, started before the tokenizer loads
(dataflow/preprocess/readers/cut_process.py): the same pieces as the cut in this process, decompressing while the
tokenizer loads, gone when the run ends however it ends, and a clear line when it dies."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import zstandard

from support import kill_points
from support.data import GPT2_JSON
from dataflow.errors import InputError
from dataflow.preprocess import startup
from dataflow.preprocess.plan import plan_units
from dataflow.sources import cut_process, expand, read_bundles
from dataflow.preprocess.run import TokenizeConfig, tokenize
from support.cli import same_data
from support.cli import tokenize_small

PIECE = 64 << 10


@pytest.fixture(scope="module")
def zst(kjv, tmp_path_factory) -> Path:
    """The KJV corpus as one .jsonl.zst (about 4.5 MB of JSONL: 70 pieces of 64 KB)."""
    with open(kjv, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    path = tmp_path_factory.mktemp("cut") / "kjv.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    return path


def _cut_children() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name == "dataflow-cut"]


def test_the_cut_process_gives_the_pieces_and_bytes_of_the_cut_in_this_process(tmp_path, zst, kjv):
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b'{"text": "before"}\n')
    bundles = [[u] for u in plan_units([str(zst), str(plain)])]
    for folder in ("here", "child"):
        (tmp_path / folder).mkdir()
    here = list(expand(bundles, PIECE, 3, str(tmp_path / "here")))
    reading = read_bundles(bundles, PIECE, 3, str(tmp_path / "child"), depth=2)
    assert isinstance(reading, cut_process.CutProcess)
    try:
        child = list(reading)
    finally:
        reading.close()
    assert len(child) == len(here) > 10 and here[-1] == child[-1] == bundles[1]
    for [a], [b] in zip(here[:-1], child[:-1]):  # the pieces, from piece 3 on (a resumed run's first bundle)
        assert Path(a.spill).read_bytes() == Path(b.spill).read_bytes()
        assert dataclasses.replace(a, spill=None) == dataclasses.replace(b, spill=None)
    assert here[0][0].piece == 3 and here[-2][0].last and not _cut_children()


def test_what_needs_no_cut_here_is_read_lazily_in_this_process(tmp_path, zst):
    bundles = [[u] for u in plan_units([str(zst)])]
    for spill, whole in ((None, False), (str(tmp_path), True)):
        assert type(read_bundles(bundles, PIECE, 0, spill, whole)) is cut_process.Reading
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b'{"text": "a"}\n')
    assert type(read_bundles([[u] for u in plan_units([str(plain)])], PIECE, 0, str(tmp_path))) is cut_process.Reading


def test_the_file_is_decompressed_while_the_tokenizer_loads(tmp_path, zst, monkeypatch):
    out = tmp_path / "out"
    seen = []
    load = startup.proven_tokenizer

    def load_once_pieces_wait(cfg):  # the tokenizer loads once the cut process has spilled its first piece
        seen.append([p.name for p in _cut_children()])
        deadline = time.monotonic() + 60
        while not list(out.rglob("piece-*.jsonl")):
            assert time.monotonic() < deadline, "no piece was spilled while the tokenizer loaded"
            time.sleep(0.01)
        return load(cfg)

    monkeypatch.setattr(startup, "proven_tokenizer", load_once_pieces_wait)
    tokenize(TokenizeConfig(inputs=[str(zst)], out=str(out), tokenizer=str(GPT2_JSON), workers=1,
                            unit_bytes=PIECE, progress=False))
    assert seen == [["dataflow-cut"]]
    assert not _cut_children() and not list(out.rglob("piece-*.jsonl"))


def test_a_cut_process_that_dies_is_one_line_and_the_rerun_gives_a_clean_runs_bytes(tmp_path, zst, monkeypatch):
    cut_here = cut_process.expand

    def killed_after_two(*args, **kwargs):
        for n, bundle in enumerate(cut_here(*args, **kwargs)):
            if n == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
            yield bundle

    monkeypatch.setattr(cut_process, "expand", killed_after_two)
    settings = dict(tokenizer=str(GPT2_JSON), workers=1, unit_bytes=PIECE, shard_size="512KB", progress=False)
    with pytest.raises(InputError, match=r"kjv\.jsonl\.zst: the process decompressing it stopped \(exit code -9\); "
                                         r"run the same command again to resume"):
        tokenize(TokenizeConfig(inputs=[str(zst)], out=str(tmp_path / "out"), **settings))
    assert not _cut_children()
    monkeypatch.undo()
    tokenize(TokenizeConfig(inputs=[str(zst)], out=str(tmp_path / "out"), **settings))
    tokenize(TokenizeConfig(inputs=[str(zst)], out=str(tmp_path / "ref"), **settings))
    assert same_data(tmp_path / "out") == same_data(tmp_path / "ref")


def test_ctrl_c_while_the_file_is_cut_stops_the_cut_process_too_and_the_rerun_resumes(tmp_path, zst):
    out = tmp_path / "out"
    args = ("tokenize", zst, "-o", out, "--workers", "1", "--shard-size", "512KB", "--unit-size", "64KB",
            "--no-progress")
    code, err, took = kill_points.ctrl_c_while_holding(0, tmp_path / "holding", *args)
    assert code == 130 and err.strip().splitlines()[-1] == "dataflow tokenize: interrupted" and took < 2, (err, took)
    deadline = time.monotonic() + 10  # the kernel kills a child whose parent died (die_with_parent) at once
    while subprocess.run(["pgrep", "-f", str(out)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a process of the interrupted run is still alive"
        time.sleep(0.05)
    tokenize_small(zst, out, "--workers", "1", "--unit-size", "64KB", "--no-progress")
    tokenize_small(zst, tmp_path / "ref", "--workers", "1", "--unit-size", "64KB", "--no-progress")
    assert same_data(out) == same_data(tmp_path / "ref")


def test_a_bug_in_the_cut_process_reaches_the_run_with_where_it_happened(tmp_path, zst, monkeypatch):
    def broken(*args, **kwargs):
        yield from ()
        raise ValueError("a bug")

    monkeypatch.setattr(cut_process, "expand", broken)
    with pytest.raises(ValueError, match="a bug") as raised:
        tokenize(TokenizeConfig(inputs=[str(zst)], out=str(tmp_path / "out"), tokenizer=str(GPT2_JSON), workers=1,
                                unit_bytes=PIECE, progress=False))
    if hasattr(raised.value, "add_note"):  # Python 3.11+: the child's traceback as a note
        assert "in the cut process" in raised.value.__notes__[0] and "in broken" in raised.value.__notes__[0]
    assert not _cut_children()
