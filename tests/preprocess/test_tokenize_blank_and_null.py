"""A blank JSONL line (empty, or only whitespace) holds no record: it is skipped, as pyarrow's and `datasets`'
JSON readers skip it, never counted against --max-errors nor logged, and the lines after it keep their numbers
(in the error log, in derived ids), whatever the cut of the file into units or pieces.

Bad records are named by their real cause, in every reader that has the concept: a text field that is there
but JSON null (or an Arrow null) is "field 'text' is null", one that is not there "missing field 'text'", and a
text that is not a string names its kind (a number, a list, an object, a boolean), in the bulk path and the
line-by-line one alike."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest
import zstandard
import pyarrow.parquet as pq

from dataflow.cli import main


def tokenize(src, out, *extra) -> int:
    return main(["tokenize", str(src), "-o", str(out), "--no-progress", "--workers", "1", *map(str, extra)])


def logged(out) -> list[dict]:
    return [json.loads(line) for line in (out / "_errors.jsonl").read_text().splitlines()]


BAD = [({"id": "n", "text": None}, "field 'text' is null, not a string"),
       ({"id": "m", "title": "no text"}, "missing field 'text'"),
       ({"id": "i", "text": 7}, "field 'text' is a number, not a string"),
       ({"id": "f", "text": 2.5}, "field 'text' is a number, not a string"),
       ({"id": "l", "text": ["a", "b"]}, "field 'text' is a list, not a string"),
       ({"id": "o", "text": {"k": "v"}}, "field 'text' is an object, not a string"),
       ({"id": "b", "text": True}, "field 'text' is a boolean, not a string")]


def test_each_bad_jsonl_record_names_its_cause(tmp_path):
    src = tmp_path / "in.jsonl"
    records = [{"id": "ok", "text": "fine"}] + [r for r, _ in BAD] + [{"id": "end", "text": "also fine"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tokenize(src, tmp_path / "out") == 0
    assert [(e["line"], e["id"], e["reason"]) for e in logged(tmp_path / "out")] == \
        [(k + 2, r["id"], reason) for k, (r, reason) in enumerate(BAD)]


def test_a_null_text_among_records_read_in_bulk_is_null_not_missing(tmp_path):
    """One null among thousands of good records: the block pyarrow reads in bulk names it too."""
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(5000)]
    lines[1234] = json.dumps({"text": None})
    lines[4321] = json.dumps({"body": "x"})
    src.write_text("\n".join(lines) + "\n")
    assert tokenize(src, tmp_path / "out") == 0
    assert [(e["line"], e["reason"]) for e in logged(tmp_path / "out")] == \
        [(1235, "field 'text' is null, not a string"), (4322, "missing field 'text'")]


def test_parquet_nulls_and_a_column_that_is_not_text_name_their_kind(tmp_path):
    pq.write_table(pa.table({"text": pa.array(["a", None, "c"])}), tmp_path / "nulls.parquet")
    assert tokenize(tmp_path / "nulls.parquet", tmp_path / "out") == 0
    assert [(e["row"], e["reason"]) for e in logged(tmp_path / "out")] == [(1, "field 'text' is null, not a string")]
    pq.write_table(pa.table({"text": pa.array([[1], None])}), tmp_path / "lists.parquet")
    assert tokenize(tmp_path / "lists.parquet", tmp_path / "out2", "--max-errors", "5") == 1  # no document
    assert [(e["row"], e["reason"]) for e in logged(tmp_path / "out2")] == \
        [(0, "field 'text' is a list, not a string"), (1, "field 'text' is null, not a string")]


def test_a_datasets_folder_null_text_is_null(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["a", None, "c"]}).save_to_disk(str(tmp_path / "hf"))
    assert tokenize(tmp_path / "hf", tmp_path / "out") == 0
    assert [(e["row"], e["reason"]) for e in logged(tmp_path / "out")] == [(1, "field 'text' is null, not a string")]


BLANKS = [b"", b"   ", b"\t", b"\r", b" \t \r"]


def with_blanks(count: int, every: int, bad: set[int]) -> tuple[bytes, list[int]]:
    """`count` records, blank lines of every kind after every `every`th, the records numbered in `bad` broken:
    the file, and the line numbers (from 1) of the broken ones."""
    lines, bad_lines = [], []
    for i in range(count):
        if i in bad:
            lines.append(b"{broken")
            bad_lines.append(len(lines))
        else:
            lines.append(json.dumps({"text": f"record {i} " * (i % 13 + 1)}).encode())
        if i % every == every - 1:
            lines.extend(BLANKS[: i % len(BLANKS) + 1])
    return b"\n".join(lines) + b"\n", bad_lines


def decoded(out) -> list[dict]:
    p = subprocess.run([sys.executable, "-m", "dataflow", "decode", str(out)], capture_output=True, text=True,
                       check=True)
    return [json.loads(x) for x in p.stdout.splitlines()]


def test_blank_lines_are_no_records_and_no_errors(tmp_path):
    data, _ = with_blanks(40, 3, set())
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n\n" + data + b"   \n\n")
    assert tokenize(src, tmp_path / "out", "--max-errors", "0") == 0
    assert (tmp_path / "out" / "_errors.jsonl").read_text() == ""
    docs = decoded(tmp_path / "out")
    assert [d["text"] for d in docs] == [f"record {i} " * (i % 13 + 1) for i in range(40)]
    at = [k for k in range(len(src.read_bytes())) if k == 0 or src.read_bytes()[k - 1:k] == b"\n"]
    assert all(d["id"].startswith("in.jsonl@") and int(d["id"].split("@")[1]) in at for d in docs)


@pytest.mark.parametrize("compressed, extra", [(False, []), (False, ["--unit-size", "64KB"]),
                                               (True, ["--unit-size", "64KB"])])
def test_a_bad_record_after_blank_lines_keeps_its_line_number(tmp_path, compressed, extra):
    """Blank lines in the bulk path (thousands of records), across units of a plain file and pieces of a
    compressed one: the bad records' lines are their lines in the file, and only they count as errors."""
    data, bad_lines = with_blanks(6000, 7, {5, 2500, 5999})
    src = tmp_path / ("in.jsonl.zst" if compressed else "in.jsonl")
    src.write_bytes(zstandard.ZstdCompressor().compress(data) if compressed else data)
    assert tokenize(src, tmp_path / "out", "--max-errors", "3", *extra) == 0
    errors = logged(tmp_path / "out")
    assert [e["line"] for e in errors] == bad_lines and all("invalid JSON" in e["reason"] for e in errors)
    assert [data.split(b"\n")[n - 1] for n in bad_lines] == [b"{broken"] * 3
    assert len(decoded(tmp_path / "out")) == 6000 - 3


def test_an_input_of_only_blank_lines_holds_no_record(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n   \n\t\n\r\n")
    assert tokenize(src, tmp_path / "out", "--max-errors", "0") == 1
    err = capsys.readouterr().err
    assert "no document read (the input holds no record)" in err and "more than --max-errors" not in err


def test_a_first_record_after_blank_lines_is_checked_for_the_text_field(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n\n" + json.dumps({"body": "x"}).encode() + b"\n")
    assert tokenize(src, tmp_path / "out") == 2
    assert "--text-field text: the first record" in capsys.readouterr().err
