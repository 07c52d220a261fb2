"""Ids that are not strings, and the files a `datasets` folder's state lists, read alike by every reader.

An id that is not a string is named by its JSON text (`true`, `{"k": "v"}`, `[1, 2]`) whether it comes from
JSONL, Parquet or a `datasets` folder (Parquet and `datasets` gave Python's `True`); numbers keep their text.
A `state.json` that lists a file that is not a string name is one line; a file it lists twice is read twice,
as `datasets.load_from_disk` reads it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.cli import decoded, tokenize

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

# id values of each type, with the text every reader must name them by
IDS = {
    "bool": ([True, False], ["true", "false"]),
    "object": ([{"k": "v", "n": 1}, {"k": "é", "n": 2}], ['{"k": "v", "n": 1}', '{"k": "é", "n": 2}']),
    "list": ([[1, 2], [3]], ["[1, 2]", "[3]"]),
    "float": ([2.5, 7.0], ["2.5", "7.0"]),
    "int": ([7, -3], ["7", "-3"]),
    "string": (["a", "b"], ["a", "b"]),
}


def write_inputs(folder) -> dict[str, str]:
    """One file of each id type for each reader (`datasets` folders saved by the library itself); returns
    each document's text -> the id it must get."""
    expected = {}
    for kind, (values, texts) in IDS.items():
        docs = {f"{reader} {kind} {i}": value for reader in ("jsonl", "parquet", "datasets")
                for i, value in enumerate(values)}
        expected.update({text: texts[int(text.rsplit(" ", 1)[1])] for text in docs})
        rows = [{"text": t, "id": v} for t, v in docs.items()]
        (folder / "jsonl").mkdir(parents=True, exist_ok=True)
        with open(folder / "jsonl" / f"{kind}.jsonl", "w") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows if r["text"].startswith("jsonl"))
        table = [r for r in rows if r["text"].startswith("parquet")]
        (folder / "parquet").mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(table), folder / "parquet" / f"{kind}.parquet")
        hf = [r for r in rows if r["text"].startswith("datasets")]
        datasets.Dataset.from_list(hf).save_to_disk(str(folder / "datasets" / kind))
    return expected


def test_an_id_that_is_not_a_string_is_its_json_text_from_every_reader(tmp_path, capsys):
    expected = write_inputs(tmp_path / "in")
    assert tokenize(tmp_path / "in", tmp_path / "out") == 0
    got = {d["text"]: d["id"] for d in decoded(tmp_path / "out", capsys)}
    assert got == expected


def saved(folder, n: int = 6, shards: int = 2) -> dict:
    datasets.Dataset.from_dict({"text": [f"doc {i}" for i in range(n)]}).save_to_disk(str(folder), num_shards=shards)
    return json.loads((folder / "state.json").read_text())


@pytest.mark.parametrize("entry", [{"filename": 7}, {"filename": None}, {"filename": ["data-00000-of-00002.arrow"]},
                                   "data-00000-of-00002.arrow", {}])
def test_a_state_that_lists_a_file_by_no_string_name_is_one_line(tmp_path, capsys, entry):
    state = saved(tmp_path / "ds")
    state["_data_files"][1] = entry
    (tmp_path / "ds" / "state.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert tokenize(tmp_path / "ds", tmp_path / "out") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(tmp_path / "ds" / "state.json") in err and "save it again" in err, err


def test_a_state_that_lists_a_file_twice_is_read_as_datasets_reads_it(tmp_path, capsys):
    state = saved(tmp_path / "ds")
    state["_data_files"] = state["_data_files"] + state["_data_files"][:1]
    (tmp_path / "ds" / "state.json").write_text(json.dumps(state))
    rows = datasets.load_from_disk(str(tmp_path / "ds"))["text"]
    assert len(rows) == 9  # what `datasets` itself reads: the first file twice
    assert tokenize(tmp_path / "ds", tmp_path / "out") == 0
    assert [d["text"] for d in decoded(tmp_path / "out", capsys)] == list(rows)
    # the same folder named twice (or by a glob and a path) is still read once
    assert tokenize([tmp_path / "ds", tmp_path / "ds"], tmp_path / "twice") == 0
    assert [d["text"] for d in decoded(tmp_path / "twice", capsys)] == list(rows)
