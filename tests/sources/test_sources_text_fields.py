"""Several text fields joined into one document (`--text-field title,text`), read through `dataflow.sources`.

KJV's records carry a title and a text: as JSONL (plain and compressed), Parquet and a `datasets` folder each
document is title + separator + text, exactly; a record missing one of the fields, or holding null or a
number in one, is the bad record a single field gives, naming that field; a table without one of the columns
is one line; and a worker given the parsed fields writes the joined documents into its shards."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dataflow.errors import ConfigError, InputError
from dataflow.formats.manifest import Manifest
from dataflow.formats.reader import iter_shard_documents
from dataflow.preprocess.plan import plan_units
from dataflow.preprocess.worker import UnitSpec, tokenize_bundle
from dataflow.sources import (DEFAULT_SEPARATOR, TextFields, default_ids, expand, expand_inputs,
                              parse_text_fields, read_unit_blocks, separator_arg)
from dataflow.tokenizers.load import load_tokenizer

TITLE_TEXT = TextFields(("title", "text"))


@pytest.fixture(scope="module")
def kjv_rows(kjv) -> list[dict]:
    with open(kjv, "rb") as f:
        return [json.loads(line) for line in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()]


def records(path, fields, id_field: str = "id", unit_bytes: int = 256 << 10) -> list[tuple]:
    """(id, text, error) of every record of `path`, through the readers' public face (ids derived as a
    worker derives them)."""
    out = []
    for bundle in expand([plan_units(expand_inputs([str(path)]), unit_bytes)], unit_bytes):
        for unit in bundle:
            first = 0
            for block in read_unit_blocks(unit, fields, id_field):
                positions = np.arange(first, first + len(block)) if block.positions is None else block.positions
                first += len(block)
                out += zip(default_ids(unit, block, positions).to_pylist(), block.texts.to_pylist(),
                           block.errors.to_pylist())
    return out


def joined(rows: list[dict], fields=("title", "text"), sep: str = DEFAULT_SEPARATOR) -> list[tuple]:
    return [(r["id"], sep.join(r[f] for f in fields), None) for r in rows]


def as_parquet(rows: list[dict], path) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=100)  # 12 row groups: 12 units
    return str(path)


def as_datasets_folder(rows: list[dict], path) -> str:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(path), num_shards=3)
    return str(path)


def test_kjv_title_and_text_are_one_document_in_every_kind(kjv, kjv_rows, tmp_path):
    plain = tmp_path / "kjv.jsonl"
    plain.write_bytes(zstandard.ZstdDecompressor().stream_reader(open(kjv, "rb")).read())
    want = joined(kjv_rows)
    assert records(plain, TITLE_TEXT) == want  # cut into 17 byte ranges
    assert records(kjv, TITLE_TEXT) == want  # compressed: cut into pieces as it is read
    assert records(as_parquet(kjv_rows, tmp_path / "kjv.parquet"), TITLE_TEXT) == want
    assert records(as_datasets_folder(kjv_rows, tmp_path / "ds"), TITLE_TEXT) == want
    reverse = parse_text_fields("text, title", " | ")  # any order, any separator; spaces around names dropped
    assert records(plain, reverse) == joined(kjv_rows, ("text", "title"), " | ")
    assert records(tmp_path / "kjv.parquet", reverse) == joined(kjv_rows, ("text", "title"), " | ")


def test_one_field_given_as_fields_is_that_field(kjv, kjv_rows, tmp_path):
    parquet = as_parquet(kjv_rows, tmp_path / "kjv.parquet")
    for path in (kjv, parquet):
        assert records(path, TextFields(("text",))) == records(path, "text") == joined(kjv_rows, ("text",))


def test_a_missing_null_or_number_field_is_the_bad_record_it_names(kjv_rows, tmp_path):
    rows = [dict(r) for r in kjv_rows[:40]]
    del rows[3]["title"]
    rows[7]["title"] = None
    rows[9]["text"] = None  # named: the title is fine
    rows[11]["title"] = 12
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {i: e for i, (_, _, e) in enumerate(records(src, TITLE_TEXT)) if e}
    assert got == {3: "missing field 'title'", 7: "field 'title' is null, not a string",
                   9: "field 'text' is null, not a string", 11: "field 'title' is a number, not a string"}
    tables = [dict(r) for r in kjv_rows[:40]]
    tables[7]["title"] = tables[9]["text"] = None
    got = {i: e for i, (_, _, e) in enumerate(records(as_parquet(tables, tmp_path / "n.parquet"), TITLE_TEXT)) if e}
    assert got == {7: "field 'title' is null, not a string", 9: "field 'text' is null, not a string"}
    got = {i: e for i, (_, _, e) in enumerate(records(as_datasets_folder(tables, tmp_path / "n"), TITLE_TEXT)) if e}
    assert got == {7: "field 'title' is null, not a string", 9: "field 'text' is null, not a string"}
    numbers = [{"title": i, "text": r["text"]} for i, r in enumerate(kjv_rows[:5])]  # a column of numbers
    got = [e for _, _, e in records(as_parquet(numbers, tmp_path / "numbers.parquet"), TITLE_TEXT)]
    assert got == ["field 'title' is a number, not a string"] * 5


def test_a_table_without_one_of_the_columns_is_one_line(kjv_rows, tmp_path):
    rows = [{"id": r["id"], "text": r["text"]} for r in kjv_rows[:20]]
    with pytest.raises(InputError, match=r"no column 'title' \(columns: id, text\)$"):
        records(as_parquet(rows, tmp_path / "t.parquet"), TITLE_TEXT)
    with pytest.raises(InputError, match=r"no column 'title' \(columns: id, text\); pass --text-field"):
        records(as_datasets_folder(rows, tmp_path / "t"), TITLE_TEXT)


def test_the_id_may_be_one_of_the_text_fields(kjv_rows, tmp_path):
    src = tmp_path / "few.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in kjv_rows[:30]))
    want = [(r["id"], f"{r['id']}\n\n{r['text']}", None) for r in kjv_rows[:30]]
    assert records(src, TextFields(("id", "text"))) == want
    assert records(as_parquet(kjv_rows[:30], tmp_path / "few.parquet"), TextFields(("id", "text"))) == want


def test_the_command_line_spelling_is_parsed_once():
    assert parse_text_fields("title,text") == TextFields(("title", "text"), "\n\n")
    assert parse_text_fields("text", "") == TextFields(("text",), "")
    with pytest.raises(ConfigError, match=r"^--text-field 'title,': an empty field name"):
        parse_text_fields("title,")
    with pytest.raises(ConfigError, match=r"^--text-field 'text,title,text' names 'text' twice"):
        parse_text_fields("text,title,text")
    assert separator_arg(r"\n\n") == "\n\n" and separator_arg(r" \t| ") == " \t| " and separator_arg("\\\\n") == "\\n"


def test_a_worker_given_the_fields_writes_the_joined_documents(kjv_rows, tmp_path):
    src = tmp_path / "few.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in kjv_rows[:50]))
    meta = load_tokenizer("bytes").meta
    spec = UnitSpec("bytes", "auto", parse_text_fields("title,text", " -- "), "id", 256, meta)
    [result] = tokenize_bundle(plan_units([str(src)]), spec, str(tmp_path / "scratch"))
    assert result.documents == 50 and not result.errors
    manifest = Manifest(meta, shards=result.shards["train"])
    docs = [(doc_id, bytes(tokens[:-1].astype("uint8")).decode())  # the bytes tokenizer: a byte a token, EOS last
            for shard in result.shards["train"]
            for doc_id, tokens in iter_shard_documents(str(tmp_path / "scratch" / shard.path), manifest, shard)]
    assert docs == [(r["id"], f"{r['title']} -- {r['text']}") for r in kjv_rows[:50]]
