"""`dataflow tokenize` of a Hugging Face `datasets` folder (`save_to_disk`), written here by the real library.

The folder's records come in stored order, in bulk, and tokenize to exactly the ids of the same texts given
as JSONL; the bytes do not depend on --workers; a DatasetDict folder and every damaged folder are one line."""

from __future__ import annotations

import json
import shutil

import pytest

from support.data import GPT2_JSON
from support.cli import dataset_bytes
from support.cli import tokenize, decoded
from support.data import texts, token_ids

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()


def save(folder, n: int = 2600, shards: int = 3, ids: bool = True, **columns) -> list[dict]:
    rows = {"text": texts(n), **({"id": [f"doc-{i}" for i in range(n)]} if ids else {}), "n": list(range(n))}
    rows.update(columns)
    ds = datasets.Dataset.from_dict(rows)
    ds.shuffle(seed=3).save_to_disk(str(folder), num_shards=shards)  # stored order: the shuffled one
    return [dict(zip(ds.column_names, r)) for r in zip(*datasets.load_from_disk(str(folder)).to_dict().values())]


@pytest.mark.parametrize("tokenizer", ["bytes", str(GPT2_JSON)])
def test_a_datasets_folder_gives_the_ids_of_the_same_texts_as_jsonl(tmp_path, capsys, tokenizer):
    rows = save(tmp_path / "ds")
    with open(tmp_path / "same.jsonl", "w") as f:
        f.writelines(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in rows)
    common = ["--tokenizer", tokenizer, "--unit-size", "64KB", "--workers", "2"]
    assert tokenize(tmp_path / "ds", tmp_path / "a", *common) == 0
    assert tokenize(tmp_path / "same.jsonl", tmp_path / "b", *common) == 0
    got = decoded(tmp_path / "a", capsys)
    assert got == decoded(tmp_path / "b", capsys)
    assert got == [{"id": r["id"], "text": r["text"]} for r in rows]  # stored order, every record once
    assert token_ids(tmp_path / "a") == token_ids(tmp_path / "b")


@pytest.mark.parametrize("unit", ["64KB", "32MB"])
def test_workers_1_and_2_give_the_same_bytes_and_ids_name_file_and_row(tmp_path, capsys, unit):
    save(tmp_path / "ds", ids=False)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        assert tokenize(tmp_path / "ds", out, "--unit-size", unit, "--workers", workers, "--val-fraction", "0.1") == 0
        outs.append(dataset_bytes(out))
    assert outs[0] == outs[1]
    ids = [d["id"] for split in ("train", "val") for d in decoded(tmp_path / "w1" / split, capsys)]
    assert sorted(ids) == sorted(f"data-0000{k}-of-00003.arrow:{r}" for k, n in enumerate((867, 867, 866))
                                 for r in range(n))


def test_a_folder_of_inputs_takes_a_datasets_folder_in_it_and_not_its_metadata(tmp_path, capsys):
    rows = save(tmp_path / "in" / "b_ds", n=50, shards=2)
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"id": "first", "text": "from jsonl"}) + "\n")
    (tmp_path / "in" / "c.txt").write_text("from text")
    assert tokenize(tmp_path / "in", tmp_path / "out") == 0
    assert not (tmp_path / "out" / "_errors.jsonl").read_text()
    assert [d["id"] for d in decoded(tmp_path / "out", capsys)] == ["first", *[r["id"] for r in rows], "c.txt"]


def test_a_dataset_dict_folder_is_refused_naming_its_splits(tmp_path, capsys):
    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    capsys.readouterr()
    assert tokenize(tmp_path / "dd", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "splits: train, test" in err and str(tmp_path / "dd" / "train") in err


def _one_line(capsys, code, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return code


@pytest.mark.parametrize("case", ["no text field", "numbers as text", "state names a missing file",
                                  "cut arrow file", "garbage arrow file", "state.json not json"])
def test_a_damaged_folder_is_one_line(tmp_path, capsys, case):
    folder = tmp_path / "ds"
    if case == "numbers as text":
        save(folder, n=40, shards=2, text=list(range(40)))
    else:
        save(folder, n=3000, shards=2)
    data = folder / "data-00001-of-00002.arrow"
    if case == "state names a missing file":
        data.unlink()
    elif case == "cut arrow file":
        data.write_bytes(data.read_bytes()[:-5000])
    elif case == "garbage arrow file":
        raw = bytearray(data.read_bytes())
        raw[:64] = b"\x00" * 64
        data.write_bytes(bytes(raw))
    elif case == "state.json not json":
        (folder / "state.json").write_text("{")
    args = ["--text-field", "body"] if case == "no text field" else []
    capsys.readouterr()
    code = tokenize(folder, tmp_path / "out", *args)
    expected = {"no text field": (2, "--text-field body", "no such field"),
                "numbers as text": (1, "'text' holds int64, not strings"),
                "state names a missing file": (1, "data-00001-of-00002.arrow", "save it again"),
                "cut arrow file": (1, "data-00001-of-00002.arrow", "save it again"),
                "garbage arrow file": (1, "data-00001-of-00002.arrow", "not a readable Arrow stream"),
                "state.json not json": (1, "state.json", "save it again")}[case]
    assert _one_line(capsys, code, *expected[1:]) == expected[0]


def test_a_datasets_folder_is_read_without_the_datasets_library(tmp_path):
    save(tmp_path / "ds", n=30, shards=1)
    import subprocess
    import sys

    code = ("import sys; from dataflow.cli import main; "
            f"rc = main(['tokenize', {str(tmp_path / 'ds')!r}, '-o', {str(tmp_path / 'out')!r}, '--no-progress', "
            "'--workers', '1']); print('datasets' in sys.modules, rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout.split()[-2:] == ["False", "0"], p.stderr
    shutil.rmtree(tmp_path / "out")
