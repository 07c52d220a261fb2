"""Bad records are named by their real cause, in every reader that has the concept: a text field that is there
but JSON null (or an Arrow null) is "field 'text' is null", one that is not there "missing field 'text'", and a
text that is not a string names its kind (a number, a list, an object, a boolean), in the bulk path and the
line-by-line one alike."""

from __future__ import annotations

import json

import pyarrow as pa
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
