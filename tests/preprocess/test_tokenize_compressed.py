"""One large compressed JSONL file is split across workers: pieces of its decompressed stream.

KJV, with a few bad records, as `.jsonl.zst/.gz/.bz2/.xz`: the output is byte-identical to the plain
`.jsonl` run for 1 and 2 workers, bad records keep their line numbers, a kill -9 in the middle of the
file resumes to the same bytes, and the progress bar counts decompressed bytes to 100%.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma

import pytest
import zstandard

from support.cli import dataset_bytes, tokenize_small
from support.cli import same_data
from support.kill_points import kill_at_pieces

COMPRESS = {".zst": lambda b: zstandard.ZstdCompressor(level=3).compress(b), ".gz": gzip.compress,
            ".bz2": bz2.compress, ".xz": lzma.compress}


@pytest.fixture(scope="module")
def kjv_lines(kjv) -> list[bytes]:
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    lines.insert(700, b"not json\n")  # bad records deep inside the file: in a later piece
    lines.insert(1100, b'{"id": "x", "title": "no text"}\n')
    return lines


def test_plain_run_and_pieces_agree(tmp_path, kjv_lines):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "kjv.jsonl").write_bytes(b"".join(kjv_lines))
    tokenize_small(tmp_path / "plain" / "kjv.jsonl", tmp_path / "ref", "--workers", "1", "--no-progress")
    reference = same_data(tmp_path / "ref")
    want_errors = (tmp_path / "ref" / "_errors.jsonl").read_text().replace("plain/kjv.jsonl", "")
    assert [json.loads(e)["line"] for e in want_errors.splitlines()] == [701, 1101]
    for suffix, compress in COMPRESS.items():
        src = tmp_path / suffix[1:] / f"kjv.jsonl{suffix}"
        src.parent.mkdir()
        src.write_bytes(compress(b"".join(kjv_lines)))
        for workers in (1, 2):
            out = tmp_path / f"out{suffix}-{workers}"
            p = tokenize_small(src, out, "--workers", workers, "--json", "--no-progress")
            assert json.loads(p.stdout)["units"] == 1  # one file, one unit of the plan ...
            assert same_data(out) == reference, (suffix, workers)  # ... the same bytes as the plain run
            errors = (out / "_errors.jsonl").read_text().replace(f"{suffix[1:]}/kjv.jsonl{suffix}", "")
            assert errors == want_errors


def test_the_progress_bar_counts_decompressed_bytes_to_100_percent(tmp_path, kjv_lines):
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(COMPRESS[".zst"](b"".join(kjv_lines)))
    p = tokenize_small(src, tmp_path / "out", "--workers", "2")
    frames = [f for f in p.stderr.replace("\r", "\n").splitlines() if f.startswith("tokenize")]
    size = len(b"".join(kjv_lines)) / 1e6
    assert len(frames) >= 3 and "100%" in frames[-1] and f"{size:.2f}M/{size:.2f}M" in frames[-1], frames[-3:]
    assert frames[0].startswith("tokenize (total estimated):")  # the size of a .zst's text is a guess at first
    assert frames[-1].startswith("tokenize:")  # and known once its last piece is read


def test_kill_9_in_the_middle_of_a_compressed_file_resumes_to_the_same_bytes(tmp_path, kjv_lines):
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(COMPRESS[".zst"](b"".join(kjv_lines)))
    tokenize_small(src, tmp_path / "ref", "--workers", "2", "--no-progress")
    out = tmp_path / "killed"
    journal = out / "_work" / "task-00000" / "journal.json"
    args = ["tokenize", src, "-o", out, "--no-progress", "--shard-size", "512KB", "--unit-size", "256KB",
            "--workers", "2"]
    kill_at_pieces(args, journal, (3, 9))  # in the middle of the one file
    tokenize_small(src, out, "--workers", "1", "--no-progress")
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert not (out / "_work").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_damaged_compressed_file_is_one_line_naming_it(tmp_path, kjv_lines, workers):
    """The stream is read ahead on a thread (1 worker) or by the feeder (2): a damage found there is still
    the one-line error of the main process, naming the file."""
    data = COMPRESS[".zst"](b"".join(kjv_lines))
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(data[:len(data) * 2 // 3] + b"\x00" * 64 + data[len(data) * 2 // 3 + 64:])
    p = tokenize_small(src, tmp_path / "out", "--workers", workers, "--no-progress", check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and "kjv.jsonl.zst" in p.stderr and "damaged compressed stream" in p.stderr
