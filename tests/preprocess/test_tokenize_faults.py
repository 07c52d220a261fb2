"""`dataflow tokenize` under hostile input and misuse: one line and the right exit code, never a traceback
(the reliability issue's M2, L1 and L3)."""

import json
import os
import subprocess
import sys
import time

import pytest

from support import kill_points
from support.data import GPT2_JSON
from dataflow.cli import main


def lines(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def test_a_deeply_nested_record_is_one_bad_record(tmp_path):
    deep = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    src = lines(tmp_path / "in.jsonl", [{"text": "hello"}, deep, {"text": "world"}])
    assert main(["tokenize", src, "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    errors = [json.loads(x) for x in open(tmp_path / "out" / "_errors.jsonl")]
    assert [(e["line"], e["reason"]) for e in errors] == [(2, "JSON nested too deeply to parse")]


def test_a_file_named_parquet_that_is_not_is_one_line(tmp_path, capsys):
    (tmp_path / "x.parquet").write_text("not parquet at all")
    assert main(["tokenize", str(tmp_path / "x.parquet"), "-o", str(tmp_path / "out"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.parquet: not a readable Parquet file" in err


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    src = lines(tmp_path / "in.jsonl", [{"text": "hello"}])
    (tmp_path / "file").write_text("a file, not a folder")
    assert main(["tokenize", src, "-o", str(tmp_path / "file" / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create the output folder" in err


def test_the_engine_proof_samples_a_bounded_prefix_of_a_huge_first_document(tmp_path, monkeypatch):
    from dataflow.preprocess import startup
    from dataflow.tokenizers.load import SAMPLE_CHARS

    seen = []
    real = startup.load_tokenizer

    def recording(spec, engine="auto", **kw):
        seen.append(sum(len(t) for t in kw.get("sample", ())))
        return real(spec, engine, **kw)

    monkeypatch.setattr(startup, "load_tokenizer", recording)
    big = "In the beginning was the word. " * (4 * SAMPLE_CHARS // 30)
    src = lines(tmp_path / "in.jsonl", [{"text": big}, {"text": "and the word was short"}])
    assert main(["tokenize", src, "-o", str(tmp_path / "out"), "--tokenizer", str(GPT2_JSON), "--workers", "1",
                 "--no-progress"]) == 0
    assert seen and max(seen) <= SAMPLE_CHARS  # not the whole 4x document


def test_a_second_run_into_the_same_folder_is_refused_while_the_first_runs(tmp_path, kjv):
    """The first run holds its lock, paused at its first journal save until the second has been refused."""
    out = tmp_path / "out"
    args = ["tokenize", str(kjv), "-o", str(out), "--tokenizer", str(GPT2_JSON), "--workers", "1", "--no-progress"]
    paused, go = tmp_path / "paused", tmp_path / "go"
    first = subprocess.Popen(kill_points.command({"pause": [str(paused), str(go)]}, *args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not paused.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
            time.sleep(0.02)
        second = subprocess.run([sys.executable, "-m", "dataflow", *args], capture_output=True, text=True, timeout=120)
    finally:
        go.touch()
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert second.returncode == 2 and second.stderr.count("\n") == 1
    assert "another `dataflow tokenize` is writing this folder" in second.stderr
    assert main(["verify", str(out), "--no-progress"]) == 0
    assert not os.path.exists(out / "_work")


@pytest.mark.parametrize("journal", ["{not json", "[1, 2]", '{"version": 3, "settings": {}, "bogus": 1}',
                                     '{"version": 3, "settings": {}, "next_unit": "7"}'])
def test_a_damaged_journal_is_one_line_pointing_to_overwrite(tmp_path, capsys, journal):
    from dataflow.preprocess.journal import JOURNAL_NAME, JOURNAL_VERSION

    src = lines(tmp_path / "in.jsonl", [{"text": "hello"}])
    work = tmp_path / "out" / "_work" / "task-00000"
    work.mkdir(parents=True)
    (work / JOURNAL_NAME).write_text(journal.replace('"version": 3', f'"version": {JOURNAL_VERSION}'))
    assert main(["tokenize", src, "-o", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "journal of an unfinished run is damaged" in err and "--overwrite" in err
    assert main(["tokenize", src, "-o", str(tmp_path / "out"), "--no-progress", "--overwrite"]) == 0


def test_merge_refuses_a_part_whose_tokenizer_file_leaves_the_dataset(tmp_path, capsys):
    src = lines(tmp_path / "in.jsonl", [{"text": f"document {i}"} for i in range(50)])
    out = tmp_path / "out"
    for task in (0, 1):
        assert main(["tokenize", src, "-o", str(out), "--tokenizer", str(GPT2_JSON), "--num-tasks", "2",
                     "--task-index", str(task), "--no-progress"]) == 0
    part = sorted(p for p in out.rglob("index.json"))[0]
    d = json.loads(part.read_text())
    d["tokenizer"]["file"] = "../payload.json"
    part.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["merge", str(out)]) in (1, 2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer file '../payload.json' must be relative" in err
    assert not (tmp_path / "payload.json").exists() and not (out / "index.json").exists()
