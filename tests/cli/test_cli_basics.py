"""The command line's basics: --version, help and default for every flag, progress on long commands."""

import argparse
import gc
import json
import subprocess
import sys

import pytest

from dataflow import __version__
from dataflow import cli
from dataflow.cli import build_parser, main

def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_exits_0_with_the_distribution_and_format():
    p = subprocess.run([sys.executable, "-m", "dataflow", "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith(f"dataflow {__version__} (dataflow-lm; on-disk format version 1;")
    assert p.stdout.count("\n") == 1


@pytest.mark.parametrize("name", ["tokenize", "merge", "inspect", "verify", "decode", "convert", "profile"])
def test_every_flag_has_help_and_states_its_default(name):
    parser = subcommands()[name]
    text = parser.format_help()
    for action in parser._actions:
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name} {flag} has no help"
        if action.option_strings and not any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            assert f"(default: {action.default})" in " ".join(text.split()) or "default" in action.help, flag
    assert "--debug" in text


def test_the_command_exits_with_mains_code_and_skips_the_teardown_collections(monkeypatch):
    """`dataflow` (and `python -m dataflow`) is `run`: main's exit code, and the objects it leaves are frozen,
    so that the interpreter's exit does not walk them all again (0.2-0.3 s after a tokenize)."""
    monkeypatch.setattr(cli, "main", lambda: 3)
    try:
        with pytest.raises(SystemExit) as exited:
            cli.run()
        assert exited.value.code == 3 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    entry = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points; "
                            "print(entry_points(group='console_scripts')['dataflow'].value)"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert entry == "dataflow.cli:run"


def test_usage_error_is_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect"])
    assert e.value.code == 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, kjv):
    out = tmp_path_factory.mktemp("ds") / "kjv"
    assert main(["tokenize", str(kjv), "-o", str(out), "--no-progress", "--shard-size", "1MB", "--workers", "1"]) == 0
    return out


def test_decode_to_a_file_shows_progress_and_writes_it_whole(dataset, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "back.jsonl"
    assert main(["decode", str(dataset), "-o", str(out)]) == 0
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "decode" in cap.err and "1189/1189" in cap.err and f"decoded 1,189 documents into {out}" in cap.err
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 1189 and records[0]["text"]
    assert [p.name for p in tmp_path.iterdir()] == ["back.jsonl"]  # no temporary file left beside it


def test_decode_failure_leaves_no_partial_output(dataset, tmp_path, capsys, monkeypatch):
    import dataflow.preprocess.decode as inspect_mod

    def failing(root, manifest):
        yield {"id": "x", "text": "first"}
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_mod, "decode_documents", failing)
    out = tmp_path / "back.jsonl"
    assert main(["decode", str(dataset), "-o", str(out)]) == 130
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where,said", [("folder", "is a folder; pass the path of the JSONL file"),
                                        ("in the dataset", "lies inside the dataset")])
def test_decode_output_that_is_a_folder_or_inside_the_dataset_is_refused_before_decoding(dataset, tmp_path, capsys,
                                                                                        where, said):
    target = tmp_path if where == "folder" else dataset / "shard-00000.arrow"
    before = sorted((p.name, p.stat().st_size) for p in dataset.iterdir())
    assert main(["decode", str(dataset), "-o", str(target), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert sorted((p.name, p.stat().st_size) for p in dataset.iterdir()) == before  # the dataset untouched


def test_inspect_decode_takes_a_count_of_documents(dataset, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(dataset), "--decode", "-1"])
    assert e.value.code == 2 and "'-1' is not a number of documents (0 or more)" in capsys.readouterr().err


def test_verify_shows_progress_and_no_progress_silences_it(dataset, capsys):
    capsys.readouterr()
    assert main(["verify", str(dataset)]) == 0
    cap = capsys.readouterr()
    assert "verify" in cap.err and "100%" in cap.err and cap.out.startswith("ok: ")
    assert main(["verify", str(dataset), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["decode", str(dataset), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
