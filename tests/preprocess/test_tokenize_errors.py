"""Tokenizer-side user errors: one line, exit 2, before any worker starts, the same on every run."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.data import GPT2_JSON
from dataflow.errors import ConfigError, DataflowError
from dataflow.preprocess.run import TokenizeConfig, tokenize

FORMS = ("--tokenizer accepts bytes, a path or URL to a Hugging Face tokenizer.json, ORG/NAME[@REVISION] or "
         "hf:ORG/NAME[@REVISION] (a Hugging Face Hub repository's tokenizer.json), tiktoken:PATH (a .tiktoken BPE file)")


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataflow", "tokenize", *map(str, args), "--no-progress"],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def jsonl(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "title": "t", "text": "In the beginning"}\n' * 50)
    return src


@pytest.mark.parametrize("spec, message", [
    ("{tmp}/missing/tokenizer.json", "tokenizer file not found: {tmp}/missing/tokenizer.json; " + FORMS),
    ("gpt2", "--tokenizer gpt2: not `bytes` and not a file; " + FORMS),
    ("tiktoken:{tmp}/gpt2.tiktoken", "tokenizer file not found: {tmp}/gpt2.tiktoken; " + FORMS),
])
def test_a_wrong_tokenizer_is_one_line_exit_2_the_same_every_run(tmp_path, jsonl, spec, message):
    spec, message = spec.format(tmp=tmp_path), message.format(tmp=tmp_path)
    runs = [cli(jsonl, "-o", tmp_path / "out", "--tokenizer", spec, "--workers", "2") for _ in range(2)]
    for p in runs:
        assert p.returncode == 2, p.stderr
        assert p.stderr.splitlines() == [f"dataflow tokenize: error: {message}"], p.stderr
    assert runs[0].stderr == runs[1].stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_a_wrong_tokenizer_is_a_config_error_in_python(tmp_path, jsonl):
    with pytest.raises(ConfigError, match="--tokenizer gpt2: not `bytes` and not a file") as e:
        tokenize(TokenizeConfig([str(jsonl)], str(tmp_path / "out"), tokenizer="gpt2", workers=2, progress=False))
    assert isinstance(e.value, DataflowError)


def test_a_wrong_text_field_fails_at_once_naming_the_fields(tmp_path, jsonl):
    p = cli(jsonl, "-o", tmp_path / "out", "--text-field", "content", "--tokenizer", GPT2_JSON, "--workers", "2")
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"dataflow tokenize: error: --text-field content: the first record of {jsonl} "
                                     "has no such field (its fields: id, title, text); pass --text-field with the "
                                     "one that holds the text"]
    assert not (tmp_path / "out" / "_errors.jsonl").exists()  # failed before reading records, not after 101


def test_a_wrong_text_column_of_parquet_names_the_columns(tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"], "id": ["1", "2"]}), tmp_path / "in.parquet")
    with pytest.raises(ConfigError, match=r"--text-field text: .* \(its columns: body, id\)"):
        tokenize(TokenizeConfig([str(tmp_path / "in.parquet")], str(tmp_path / "out"), progress=False))
