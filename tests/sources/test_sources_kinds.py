"""One protocol for every input kind: the run asks `dataflow.sources` about a file or unit, never its kind's name.

Each kind answers how its files are cut (`spans`), what its first record holds (`first_record_fields`), how
a unit reads (`read_unit_blocks`), how a record without an id is named (`default_ids`), where a bad record
is (`place`: a line from 1 or a row from 0) and what its names are called (`fields_word`): checked here on
real files of every kind, through the registry."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dataflow.sources import (KINDS, InputKind, default_ids, expand_inputs, fields_word, first_record_fields,
                              input_kind, kind_of, place, read_unit_blocks, spans)
from dataflow.sources.kind import DATASETS, FORMER_NAMES
from dataflow.sources.records import Unit


@pytest.fixture(scope="module")
def inputs(kjv, tmp_path_factory) -> dict[str, str]:
    """The first 30 KJV records of each kind, without ids: JSONL, Parquet (3 row groups), text, a `datasets`
    folder's Arrow file."""
    folder = tmp_path_factory.mktemp("kinds")
    with open(kjv, "rb") as f:
        rows = [json.loads(line) for line in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()[:30]]
    rows = [{"title": r["title"], "text": r["text"]} for r in rows]
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), folder / "a.parquet", row_group_size=10)
    (folder / "a.txt").write_text(rows[0]["text"])
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(folder / "ds"))
    [arrow] = expand_inputs([str(folder / "ds")])
    return {"jsonl": str(folder / "a.jsonl"), "parquet": str(folder / "a.parquet"), "text": str(folder / "a.txt"),
            DATASETS: arrow}


def units(path: str) -> list[Unit]:
    kind = input_kind(path)
    size = len(open(path, "rb").read())
    cut = spans(path, kind, size, 1 << 20)
    return [Unit(i, path, kind, "a", s.first_row, s.start, s.end, s.size) for i, s in enumerate(cut)]


def test_every_kind_is_registered_once_under_the_name_files_get(inputs):
    assert set(KINDS) == set(inputs) and all(isinstance(k, InputKind) and KINDS[n] is k for n, k in KINDS.items())
    for name, path in inputs.items():
        assert input_kind(path) == name and kind_of(name) is KINDS[name]
    for former, now in FORMER_NAMES.items():  # a name used before still finds its kind
        assert kind_of(former) is KINDS[now]
    assert DATASETS == "datasets" and kind_of("arrow") is KINDS["datasets"]  # not the shard format's name


def test_each_kind_says_where_a_record_is_and_what_its_names_are_called():
    assert [(place(k, 7), fields_word(k)) for k in ("jsonl", "text", "parquet", DATASETS)] == [
        ({"line": 8}, "fields"), ({"line": 8}, "fields"), ({"row": 7}, "columns"), ({"row": 7}, "columns")]


def test_cuts_first_fields_and_derived_ids_of_every_kind(inputs):
    assert [len(units(p)) for p in inputs.values()] == [1, 3, 1, 1]  # Parquet: a unit per row group
    assert {k: first_record_fields(p, k) for k, p in inputs.items()} == {
        "jsonl": ["title", "text"], "parquet": ["title", "text"], "text": None, DATASETS: ["title", "text"]}
    named = {}
    for kind, path in inputs.items():
        ids = []
        for unit in units(path):
            for block in read_unit_blocks(unit):
                positions = np.arange(len(block)) if block.positions is None else block.positions
                ids += default_ids(unit, block, positions).to_pylist()
        named[kind] = ids
    starts = np.cumsum([0] + [len(line) + 1 for line in open(inputs["jsonl"], "rb").read().split(b"\n")[:29]])
    assert named["jsonl"] == [f"a@{s}" for s in starts]  # where each line starts
    assert named["parquet"] == named[DATASETS] == [f"a:{r}" for r in range(30)]  # the file's rows
    assert named["text"] == ["a"]  # the file's one document
