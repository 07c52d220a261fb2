"""`file://PATH` means the local PATH for `dataflow tokenize`, as for convert and decode: `-o file:///abs/ds`
writes /abs/ds (never a folder named `file:`), reruns as complete, and file:// inputs and tokenizers read the
same files as their paths do."""

from __future__ import annotations

import os

import pytest

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.preprocess.config import TokenizeConfig


@pytest.fixture
def src(tmp_path, kjv):
    import zstandard

    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    (tmp_path / "in.jsonl").write_bytes(b"".join(lines[:80]))
    return tmp_path / "in.jsonl"


def tokenize(*args) -> int:
    return main(["tokenize", *map(str, args), "--no-progress", "--workers", "1"])


def files_under(folder) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(r, n), folder): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(folder) for n in names if n != "index.json"}


def test_an_output_file_url_is_its_local_folder(src, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tokenize(src, "-o", f"file://{tmp_path}/out") == 0
    assert not os.path.exists(tmp_path / "file:")  # no folder named after the scheme
    assert (tmp_path / "out" / "index.json").is_file()
    capsys.readouterr()
    assert tokenize(src, "-o", tmp_path / "out") == 0  # the same dataset, spelled as a path
    assert "already complete" in capsys.readouterr().out
    assert tokenize(src, "-o", f"file://{tmp_path}/out") == 0
    assert "already complete" in capsys.readouterr().out


def test_a_relative_file_url_and_file_url_inputs_and_tokenizer(src, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tokenize(src, "-o", tmp_path / "plain", "--tokenizer", GPT2_JSON) == 0
    assert tokenize(f"file://{src}", "-o", "file://rel", "--tokenizer", f"file://{GPT2_JSON}") == 0
    assert not os.path.exists(tmp_path / "file:")
    assert files_under(tmp_path / "rel") == files_under(tmp_path / "plain")


def test_the_config_holds_the_local_path():
    assert TokenizeConfig(inputs=["x.jsonl"], out="file:///data/ds").out == "/data/ds"
    for spelling in ("s3://b/ds", "s3://b/ds/", "s3://b//ds", "s3://b/ds//"):  # one prefix, spelled one way
        assert TokenizeConfig(inputs=["x.jsonl"], out=spelling).out == "s3://b/ds"
