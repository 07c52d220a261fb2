"""The columnar path reads tricky JSONL and Parquet exactly as line-by-line `json.loads` would.

Each case is tokenized through the CLI with small blocks and units (so block and unit cuts fall inside
it), and the stored documents, ids and logged bad records are compared with what `json.loads` of
each line says they must be.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.sources import jsonl

TRICKY = [
    b'{"id": "a", "text": "plain"}',
    b'{"id": 7, "text": "an integer id", "meta": {"nested": [1, {"x": 2}]}}',
    b'{"text": "no id at all"}',
    b'',  # blank line: no record (skipped, not a bad one)
    b' \t ',  # only whitespace: blank too
    b'{"id": "dup", "text": "first", "text": "second"}',  # duplicate key: json.loads keeps the last
    b'{"text": "a surrogate pair \\ud83d\\ude00 is fine"}',
    b'{"text": "a lone \\ud800 is not"}',
    b'{"text": "two objects"} {"text": "on one line"}',
    b'{"text": 5}',
    b'{"text": null, "id": "n"}',
    b'[1, 2]',
    b'{"text": "bad utf-8 \xff here"}',
    b'{"id": 2.5, "text": "a float id"}',
    b'{"id": true, "text": "a bool id"}',
    b'{"text": "crlf line"}\r',
    b'{"text": "\\u00e9t\\u00e9 <|endoftext|> stays text", "id": "s"}',
    b'{"text": "' + b"long " * 3000 + b'"}',
    b'{"text": "last line, no newline"}',
]


def expected(lines: list[bytes], name: str) -> tuple[list[dict], list[int]]:
    """Documents {id, text} and the 1-based line numbers of bad records, as json.loads sees them; a record
    without an id is named after the byte its line starts at."""
    docs, bad, start = [], [], 0
    for n, raw in enumerate(lines, 1):
        at, start = start, start + len(raw) + 1
        if not raw.strip():  # a blank line: no record, no bad one
            continue
        try:
            obj = json.loads(raw)
            text = obj.get("text") if isinstance(obj, dict) else None
            text.encode("utf-8")
        except (ValueError, AttributeError, UnicodeEncodeError):
            bad.append(n)
            continue
        if not isinstance(text, str):
            bad.append(n)
            continue
        doc_id = obj.get("id")  # a non-string id is named by its JSON text (true, 2.5, {"k": "v"})
        docs.append({"id": f"{name}@{at}" if doc_id is None else doc_id if isinstance(doc_id, str)
                     else json.dumps(doc_id, ensure_ascii=False), "text": text})
    return docs, bad


def tokenize_and_decode(src, out, *extra) -> tuple[list[dict], list[dict]]:
    cmd = [sys.executable, "-m", "dataflow", "tokenize", str(src), "-o", str(out), "--no-progress",
           "--max-errors", "1000", *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    dec = subprocess.run([sys.executable, "-m", "dataflow", "decode", str(out)], check=True, capture_output=True,
                         text=True)
    errors = [json.loads(x) for x in (out / "_errors.jsonl").read_text().splitlines()]
    return [json.loads(x) for x in dec.stdout.splitlines()], errors


@pytest.mark.parametrize("repeat", [1, 40])
def test_tricky_jsonl_reads_as_json_loads_would(tmp_path, repeat):
    lines = TRICKY * repeat
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines))
    want_docs, want_bad = expected(lines, "in.jsonl")
    docs, errors = tokenize_and_decode(src, tmp_path / "out", "--unit-size", "100KB", "--workers", "2")
    assert docs == want_docs
    assert [e["line"] for e in errors] == want_bad


def test_small_blocks_cut_inside_lines_give_the_same_records(tmp_path, monkeypatch):
    data = b"\n".join(TRICKY * 5) + b"\n"
    whole = list(jsonl.jsonl_blocks(data, "text", "id", size=1 << 30))
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 97)
    small = list(jsonl.jsonl_blocks(data, "text", "id", size=97))
    assert len(small) > len(whole)
    for column in ("texts", "ids", "errors"):
        assert sum((getattr(b, column).to_pylist() for b in small), []) == \
            sum((getattr(b, column).to_pylist() for b in whole), [])


def test_parquet_nulls_integer_ids_and_large_strings(tmp_path):
    table = pa.table({"text": pa.array(["alpha", None, "gamma <|endoftext|>", ""] * 50, pa.large_string()),
                      "id": pa.array([1, 2, None, 4] * 50, pa.int64())})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=30)
    docs, errors = tokenize_and_decode(tmp_path / "in.parquet", tmp_path / "out", "--workers", "1")
    rows = table.to_pylist()
    want = [{"id": str(r["id"]) if r["id"] is not None else f"in.parquet:{i}", "text": r["text"]}
            for i, r in enumerate(rows) if r["text"] is not None]
    assert docs == want
    assert [e["row"] for e in errors] == [i for i, r in enumerate(rows) if r["text"] is None]
    assert all("is null, not a string" in e["reason"] for e in errors)
