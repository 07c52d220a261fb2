"""`dataflow tokenize --text-field title,text --text-separator SEP`: several fields of each record joined into one
document, in the order named, the join recorded in the manifest's settings; through the real CLI on KJV."""

import json

import zstandard

from support.cli import run  # `dataflow ARGS...` in a subprocess


def kjv_records(kjv):
    with open(kjv, "rb") as f:
        return [json.loads(line) for line in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()]


def decoded(dataset, tmp_path):
    out = tmp_path / "back.jsonl"
    p = run("decode", dataset, "-o", out, "--no-progress")
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_title_and_text_are_one_document_joined_by_the_separator(tmp_path, kjv):
    p = run("tokenize", kjv, "-o", tmp_path / "ds", "--text-field", "title, text", "--text-separator", r"\n--\n",
            "--no-progress")
    assert p.returncode == 0, p.stderr
    want = {r["id"]: r["title"] + "\n--\n" + r["text"] for r in kjv_records(kjv)}
    back = decoded(tmp_path / "ds", tmp_path)
    assert len(back) == len(want) == 1189 and all(d["text"] == want[d["id"]] for d in back)
    settings = json.loads((tmp_path / "ds" / "index.json").read_text())["provenance"]["settings"]
    assert settings["text_field"] == "title, text" and settings["text_separator"] == "\n--\n"


def test_one_field_records_no_separator_and_the_default_joins_by_a_blank_line(tmp_path, kjv):
    assert run("tokenize", kjv, "-o", tmp_path / "one", "--no-progress").returncode == 0
    settings = json.loads((tmp_path / "one" / "index.json").read_text())["provenance"]["settings"]
    assert settings["text_field"] == "text" and "text_separator" not in settings  # as before: older runs resume
    assert run("tokenize", kjv, "-o", tmp_path / "two", "--text-field", "text,title", "--no-progress").returncode == 0
    first = kjv_records(kjv)[0]
    assert decoded(tmp_path / "two", tmp_path)[0]["text"] == first["text"] + "\n\n" + first["title"]


def test_a_bad_field_list_is_one_line_exit_2(tmp_path, kjv):
    for fields, says in (("title,,text", "empty"), ("text,text", "twice"), ("title,body", "body")):
        p = run("tokenize", kjv, "-o", tmp_path / "bad", "--text-field", fields, "--no-progress")
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        assert p.returncode == 2 and len(lines) == 1 and says in lines[0], (fields, p.stderr)
        assert not (tmp_path / "bad" / "index.json").exists()
