"""Work units cut anywhere give every input line exactly once.

A unit reads the lines whose first byte lies in its byte range; a line longer than a unit belongs to the
unit it starts in, and the units inside it read nothing. Checked as a property over random line lengths
(empty lines, lines many units long, a last line without a newline) and unit sizes, for every reader
that cuts a file: byte ranges of plain JSONL, the blocks inside a unit, and the pieces of a compressed
file; then end to end through the CLI, where a duplicated line would also shift every later id.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zstandard

from dataflow.preprocess.plan import Unit, plan_units
from dataflow.sources import jsonl, pieces, read_unit_blocks

UNIT_SIZES = [1, 2, 3, 5, 8, 13, 64, 257]


def corpus(seed: int, unit: int) -> bytes:
    """About 30 JSONL lines of random lengths around `unit`: short ones, blank ones, ones many units long."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(30):
        kind = rng.random()
        if kind < 0.1:
            lines.append(b"")  # a blank line: no record, no bad one, but its place counted once too
            continue
        length = int(rng.integers(0, 20) if kind < 0.6 else rng.integers(unit // 2, 2 * unit + 2) if kind < 0.85
                     else rng.integers(2 * unit, 6 * unit + 2))
        lines.append(json.dumps({"id": f"L{i}", "text": "x" * length}).encode())
    data = b"\n".join(lines)
    return data if rng.random() < 0.3 else data + b"\n"  # sometimes no newline after the last line


def expected(data: bytes) -> list[tuple]:
    """(text, id, error) of each line, as one reader of the whole file sees it."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    out = []
    for raw in lines:
        if not raw:
            out.append((None, None, None))
        else:
            obj = json.loads(raw)
            out.append((obj["text"], obj["id"], None))
    return out


def block_records(found) -> list[tuple]:
    return [r for b in found for r in zip(b.texts.to_pylist(), b.ids.to_pylist(), b.errors.to_pylist())]


@pytest.mark.parametrize("seed", range(12))
def test_byte_range_units_of_any_size_read_each_line_once(tmp_path, seed):
    for unit in UNIT_SIZES:
        data = corpus(seed, unit)
        path = tmp_path / f"in-{unit}.jsonl"
        path.write_bytes(data)
        units = plan_units([str(path)], unit)
        assert len(units) == -(-len(data) // unit)  # really cut into byte ranges of this size
        got = block_records(b for u in units for b in read_unit_blocks(u))
        assert got == expected(data), (seed, unit)


@pytest.mark.parametrize("seed", range(6))
def test_lines_longer_than_a_read_block_are_skipped_whole(tmp_path, seed):
    """The scan for a unit's first line reads in blocks too: a block smaller than the lines and the units."""
    for unit in (16, 64, 200):
        data = corpus(seed, unit)
        path = tmp_path / "in.jsonl"
        path.write_bytes(data)
        for block in (1, 3, 7, 50):
            chunks = []
            with open(path, "rb") as f:
                for start in range(0, len(data), unit):
                    chunks += jsonl._line_chunks(f, start, min(start + unit, len(data)), size=block)
            assert b"".join(chunks) == data, (seed, unit, block)


@pytest.mark.parametrize("seed", range(6))
def test_blocks_inside_a_unit_read_each_line_once(seed):
    for size in (1, 2, 7, 64, 1000):
        data = corpus(seed, size)
        got = block_records(jsonl.jsonl_blocks(data, "text", "id", size=size))
        assert got == expected(data), (seed, size)


@pytest.mark.parametrize("seed", range(6))
def test_pieces_of_a_compressed_file_read_each_line_once(tmp_path, seed):
    for piece in (1, 5, 64, 300):
        data = corpus(seed, piece)
        path = tmp_path / "in.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
        cut = list(pieces(Unit(0, str(path), "jsonl", size=path.stat().st_size), piece))
        assert b"".join(p.data for p in cut) == data
        assert all(p.data.endswith(b"\n") for p in cut[:-1]) and [p.last for p in cut].count(True) == 1
        got = block_records(b for p in cut for b in read_unit_blocks(p))
        assert got == expected(data), (seed, piece)
        spill = tmp_path / f"spill-{piece}"  # decompressed straight into each piece's file: the same cut
        spill.mkdir()
        spilled = list(pieces(Unit(0, str(path), "jsonl", size=path.stat().st_size), piece, spill_dir=str(spill)))
        assert [open(p.spill, "rb").read() for p in spilled] == [p.data for p in cut]
        assert sorted(os.listdir(spill)) == sorted(os.path.basename(p.spill) for p in spilled)


@pytest.fixture(scope="module")
def long_lines(tmp_path_factory):
    """The issue's case: 4 lines, the second 3 MB long, so that many 256 KB units start inside it."""
    folder = tmp_path_factory.mktemp("long")
    docs = [{"text": "first"}, {"text": "long " * 600_000}, {"text": "third"}, {"id": "four", "text": "fourth"}]
    data = "".join(json.dumps(d) + "\n" for d in docs).encode()
    (folder / "long.jsonl").write_bytes(data)
    (folder / "long.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    return folder, docs


@pytest.mark.parametrize("name", ["long.jsonl", "long.jsonl.zst"])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_line_longer_than_many_units_is_one_document(tmp_path, long_lines, name, workers):
    folder, docs = long_lines
    out = tmp_path / "out"
    dataflow = [sys.executable, "-m", "dataflow"]
    subprocess.run([*dataflow, "tokenize", str(folder / name), "-o", str(out), "--unit-size", "256KB",
                    "--workers", workers, "--no-progress"], check=True, capture_output=True)
    back = subprocess.run([*dataflow, "decode", str(out)], check=True, capture_output=True, text=True).stdout
    records = [json.loads(line) for line in back.splitlines()]
    assert [r["text"] for r in records] == [d["text"] for d in docs]
    starts = [0] + list(itertools.accumulate(len(json.dumps(d)) + 1 for d in docs))  # where each line begins
    assert [r["id"] for r in records] == [f"{name}@{starts[0]}", f"{name}@{starts[1]}", f"{name}@{starts[2]}", "four"]
