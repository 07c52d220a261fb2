"""How `.txt` inputs become documents: each file is one document (its id: the file's name), its text exactly;
a line that is not UTF-8 is left out of it and logged to `_errors.jsonl` with its line number, counted
against --max-errors, so one bad byte costs its line, never the file."""

from __future__ import annotations

import gzip
import json

import pytest

from support.cli import decoded, tokenize

CLEAN = "In the beginning\r\nGod created the heaven\n\nand the earth.\n"


def errors(out) -> list[tuple]:
    return [(e["file"].rsplit("/", 1)[-1], e["line"], e["reason"].split(" (")[0])
            for e in map(json.loads, (out / "_errors.jsonl").read_text().splitlines())]


def test_a_text_file_is_one_document_its_text_exactly(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(CLEAN.encode())
    (tmp_path / "empty.txt").write_bytes(b"")
    assert tokenize(tmp_path, tmp_path / "out") == 0
    assert decoded(tmp_path / "out", capsys) == [{"id": "a.txt", "text": CLEAN}, {"id": "empty.txt", "text": ""}]


@pytest.mark.parametrize("raw, kept, bad_lines", [
    (b"one\ntwo \xff\nthree\n", "one\nthree\n", [2]),  # a byte that never starts UTF-8
    (b"caf\xc3\nsecond\n", "second\n", [1]),  # a character cut at the line end
    (b"first\nlast \x80", "first", [2]),  # the last line, no newline after it
    (b"\xfe\xff\na\n\xc0\xaf\nb", "a\nb", [1, 3]),  # an overlong encoding, several bad lines
    (b"ok \xe2\x82\xac\r\nbad \xed\xa0\x80\r\n", "ok \u20ac\r\n", [2]),  # CRLF kept; a UTF-16 surrogate is not UTF-8
])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_byte_costs_its_line_not_the_file(tmp_path, capsys, raw, kept, bad_lines, workers):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(raw)
    (tmp_path / "in" / "b.txt").write_bytes(b"the next file")
    assert tokenize(tmp_path / "in", tmp_path / "out", "--workers", workers) == 0
    assert decoded(tmp_path / "out", capsys) == [{"id": "a.txt", "text": kept},
                                                   {"id": "b.txt", "text": "the next file"}]
    assert errors(tmp_path / "out") == [("a.txt", n, "undecodable bytes") for n in bad_lines]


def test_a_file_with_no_good_line_gives_no_document_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.bin.txt").write_bytes(b"\x89PNG\r\n\xff\x1a\n\x00\xff")
    (tmp_path / "in" / "b.txt").write_text("text")
    assert tokenize(tmp_path / "in", tmp_path / "out") == 0
    assert decoded(tmp_path / "out", capsys) == [{"id": "b.txt", "text": "text"}]
    assert [line for _, line, _ in errors(tmp_path / "out")] == [1, 2, 3]


def test_bad_lines_count_against_max_errors(tmp_path, capsys):
    src = tmp_path / "a.txt.gz"
    src.write_bytes(gzip.compress(b"".join(b"line %d \xff\n" % i if i % 2 else b"fine\n" for i in range(20))))
    assert tokenize(src, tmp_path / "ok", "--max-errors", "10") == 0
    assert len(errors(tmp_path / "ok")) == 10
    assert decoded(tmp_path / "ok", capsys) == [{"id": "a.txt.gz", "text": "fine\n" * 10}]
    capsys.readouterr()
    assert tokenize(src, tmp_path / "stop", "--max-errors", "3") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a.txt.gz line 8: undecodable bytes" in err and "--max-errors 3" in err
