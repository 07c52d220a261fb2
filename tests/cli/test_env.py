"""Every DATAFLOW_* variable is read in one place (dataflow/env.py); a value that cannot be used is one
line naming the variable, never a traceback and never a silent default."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from dataflow import StreamingDataset, env
from dataflow.errors import ConfigError
from support.data import KJV, write_counting_dataset

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_only_env_py_reads_dataflow_variables_and_each_is_declared():
    names = set()
    for path in list((ROOT / "dataflow").rglob("*.py")) + list((ROOT / "trainer").rglob("*.py")):
        text = path.read_text()
        names |= set(re.findall(r"\bDATAFLOW_[A-Z0-9_]+", text))
        if path.name != "env.py":
            reads = re.findall(r"(?:environ\.get\(|getenv\(|environ\[)\s*[\"'](DATAFLOW_[A-Z0-9_]+)[\"']"
                               r"\s*\]?+(?!\s*=[^=])", text)  # reads, not `environ[...] = ...` writes
            assert not reads, f"{path.relative_to(ROOT)} reads {reads} itself: use dataflow.env"
    assert names <= set(env.VARIABLES), sorted(names - set(env.VARIABLES))


def test_docs_list_every_variable():
    text = (ROOT / "docs" / "api.md").read_text()
    assert all(f"`{name}" in text for name in env.VARIABLES), [n for n in env.VARIABLES if f"`{n}" not in text]


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e400"])
def test_a_bad_number_is_one_config_error_naming_it(monkeypatch, value):
    monkeypatch.setenv("DATAFLOW_READ_TIMEOUT_S", value)
    with pytest.raises(ConfigError, match=r"DATAFLOW_READ_TIMEOUT_S='" + re.escape(value)):
        env.number("DATAFLOW_READ_TIMEOUT_S", 60.0, minimum=0.001)


@pytest.mark.parametrize("value", ["1e400GB", "lots", "-5GB", "1e30TB", "nanGB"])
def test_a_bad_cache_limit_is_refused_when_a_dataset_opens(monkeypatch, tmp_path, value):
    path = write_counting_dataset(tmp_path / "ds", tokens=2000, docs=4, shard_size="4KB")
    monkeypatch.setenv("DATAFLOW_CACHE_LIMIT", value)
    with pytest.raises(ConfigError, match="DATAFLOW_CACHE_LIMIT"):
        StreamingDataset(path, seq_len=16, shuffle=False)


@pytest.mark.parametrize("value,parsed", [("50GB", 50 << 30), ("1.5MB", int(1.5 * (1 << 20))), ("none", "none"),
                                          ("", None), ("  ", None)])
def test_good_sizes(monkeypatch, value, parsed):
    monkeypatch.setenv("DATAFLOW_CACHE_LIMIT", value)
    assert env.size("DATAFLOW_CACHE_LIMIT") == parsed


def test_flags(monkeypatch):
    for value, expected in (("1", True), ("yes", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv("DATAFLOW_DEBUG", value)
        assert env.flag("DATAFLOW_DEBUG") is expected
    monkeypatch.setenv("DATAFLOW_DEBUG", "maybe")
    with pytest.raises(ConfigError, match="DATAFLOW_DEBUG"):
        env.flag("DATAFLOW_DEBUG")


def test_an_undeclared_variable_is_a_programming_error():
    with pytest.raises(KeyError, match="not a declared"):
        env.text("DATAFLOW_NO_SUCH_THING")


@pytest.mark.parametrize("name,value", [("DATAFLOW_JOURNAL_SECONDS", "soon"),
                                        ("DATAFLOW_GIGATOKEN_CACHE_MB", "-3"),
                                        ("DATAFLOW_JOURNAL_SECONDS", "inf"),
                                        ("DATAFLOW_CACHE_LIMIT", "1e400GB"),
                                        ("DATAFLOW_FIRST_CONTACT_S", "0")])
def test_tokenize_with_a_bad_variable_exits_2_in_one_line(tmp_path, name, value):
    import os

    env_vars = dict(os.environ, **{name: value})
    p = subprocess.run([sys.executable, "-m", "dataflow", "tokenize", str(KJV), "-o", str(tmp_path / "out"),
                        "--tokenizer", "bytes", "--no-progress"],
                       capture_output=True, text=True, env=env_vars, timeout=180, cwd=ROOT)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_input_is_a_usage_error_and_still_an_input_error(tmp_path):
    from dataflow import ConfigError, InputError, InputNotFoundError
    from dataflow.sources import expand_inputs, input_kind

    (tmp_path / "x.docx").write_text("not an input")
    for check in (lambda: expand_inputs([str(tmp_path / "absent.jsonl")]),
                  lambda: expand_inputs([str(tmp_path / "*.jsonl")]),
                  lambda: input_kind(str(tmp_path / "x.docx"))):
        with pytest.raises(InputNotFoundError) as e:
            check()
        assert isinstance(e.value, ConfigError) and isinstance(e.value, InputError)
