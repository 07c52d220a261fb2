"""`dataflow tokenize` refuses what it cannot do as you asked, in one line with exit code 2 ("change what you
pass"), before it writes anything: inputs that are not there, flags out of range, flags that contradict each
other or name a field the input does not have."""

from __future__ import annotations

import json

import pytest

from dataflow.cli import build_parser, main
from dataflow.errors import ConfigError
from dataflow.preprocess.run import TokenizeConfig, tokenize


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(20)))
    return path


def refused(capsys, out, *args) -> str:
    """Run tokenize; it must exit 2 with one line and leave no output folder. Returns the line."""
    capsys.readouterr()
    assert main(["tokenize", *map(str, args), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dataflow tokenize: error: "), err
    assert not out.exists()
    return err


@pytest.mark.parametrize("inputs, message", [
    (["{tmp}/missing.jsonl"], "{tmp}/missing.jsonl: no such file or directory"),
    (["{tmp}/in.jsonl", "{tmp}/missing.jsonl.zst"], "{tmp}/missing.jsonl.zst: no such file or directory"),
    (["{tmp}/*.parquet"], "{tmp}/*.parquet: matched no input files"),
    (["{tmp}/empty"], "{tmp}/empty: matched no input files"),  # a folder without inputs
    (["{tmp}/table.csv"], "{tmp}/table.csv: unsupported input type"),
])
def test_inputs_that_are_not_there_are_usage_errors(tmp_path, capsys, src, inputs, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("not an input")
    (tmp_path / "table.csv").write_text("a,b\n")
    err = refused(capsys, tmp_path / "out", *[i.format(tmp=tmp_path) for i in inputs])
    assert message.format(tmp=tmp_path) in err


@pytest.mark.parametrize("args, message", [
    (["--workers", "-3"], "--workers -3: pass a number of worker processes (1 or more), or auto for one per CPU"),
    (["--workers", "-1"], "--workers -1: pass a number of worker processes"),
    (["--zstd-level", "40"], "--zstd-level 40: zstd levels run from 1 (fast) to 22 (small), and down to -131072"),
    (["--zstd-level", "23", "--format", "tar"], "--zstd-level 23: zstd levels run from 1"),
    (["--zstd-level", "-131073"], "--zstd-level -131073: zstd levels run from 1"),
    (["--zstd-level", "5", "--compression", "none"], "--zstd-level 5 goes with --compression zstd, not --compression "
                                                     "none; drop one of the two"),
    (["--unit-size", "1"], "--unit-size: 1 bytes is below the 64KB minimum"),
    (["--unit-size", "63KB"], "--unit-size: 64,512 bytes is below the 64KB minimum"),
    (["--id-field", "uid"], "--id-field uid: the first record of {src} has no such field (its fields: id, text); "
                            "pass --id-field with the one that holds the ids"),
])
def test_flags_out_of_range_or_contradicting_are_one_line(tmp_path, capsys, src, args, message):
    err = refused(capsys, tmp_path / "out", src, *args)
    assert message.format(src=src) in err


def test_an_empty_output_path_is_one_line(capsys, src):
    capsys.readouterr()
    assert main(["tokenize", str(src), "-o", "", "--no-progress"]) == 2
    assert capsys.readouterr().err == "dataflow tokenize: error: -o/--out is empty; pass the folder or URL to write " \
                                      "the dataset to\n"


@pytest.mark.parametrize("workers", ["auto", "AUTO", "0", "1", "2"])
def test_workers_auto_is_one_per_cpu_and_0_still_means_it(tmp_path, capsys, src, workers):
    assert main(["tokenize", str(src), "-o", str(tmp_path / "out"), "--no-progress", "--workers", workers]) == 0
    assert "20 documents" in capsys.readouterr().out


def test_the_help_names_auto_and_the_zstd_range():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["tokenize"]
    text = " ".join(sub.format_help().split())
    assert "or auto (also written 0) for one per CPU (default: auto)" in text
    assert "1 (fast) to 22 (small), or negative down to -131072" in text


@pytest.mark.parametrize("fmt", ["arrow", "tar"])
@pytest.mark.parametrize("level", ["-5", "22"])
def test_the_ends_of_the_zstd_range_work_in_both_formats(tmp_path, src, fmt, level):
    assert main(["tokenize", str(src), "-o", str(tmp_path / "out"), "--no-progress", "--format", fmt,
                 "--zstd-level", level]) == 0
    assert main(["verify", str(tmp_path / "out"), "--no-progress"]) == 0


def test_a_chosen_id_field_is_used(tmp_path, capsys, src):
    src.write_text(json.dumps({"uid": "u1", "text": "hello"}) + "\n")
    assert main(["tokenize", str(src), "-o", str(tmp_path / "out"), "--no-progress", "--id-field", "uid"]) == 0
    capsys.readouterr()
    assert main(["decode", str(tmp_path / "out"), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "u1", "text": "hello"}


@pytest.mark.parametrize("workers", [-3, "three", True])
def test_the_python_api_refuses_the_same(tmp_path, src, workers):
    with pytest.raises(ConfigError, match="--workers"):
        tokenize(TokenizeConfig([str(src)], str(tmp_path / "out"), workers=workers, progress=False))
    assert not (tmp_path / "out").exists()
