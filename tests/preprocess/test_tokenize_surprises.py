"""What a new user meets: an input with no document is one line (exit 1), not a dataset that fails training later;
the tokenizer is the same whatever path names it; a refused rerun names the setting and both values."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import zstandard

from support.cli import run as run_dataflow  # the one way the tests start `dataflow`

ARGS = ["--no-progress"]


def kjv_lines(kjv) -> list[bytes]:
    with open(kjv, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)


def tokenize(*args, cwd=None):
    return run_dataflow("tokenize", *args, *ARGS, cwd=cwd, env=dict(os.environ, PYTHONPATH=os.getcwd()))


@pytest.mark.parametrize("content, said", [
    (b"", "no document read (the input holds no record)"),
    (b"\n\n", "no document read"),
    (b'[{"text": "a"}, {"text": "b"}]\n', "all 1 records were bad"),
    (b'not json\n{"title": "no text"}\n', "all 2 records were bad"),
])
def test_an_input_without_a_document_is_one_line_not_an_empty_dataset(tmp_path, content, said):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    p = tokenize(src, "-o", tmp_path / "out")
    assert p.returncode == 1 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "out" / "index.json").exists()
    if "bad" in said:  # where the records went
        assert "_errors.jsonl" in p.stderr and (tmp_path / "out" / "_errors.jsonl").read_text().count("\n") >= 1


def test_a_parquet_input_without_a_document_gets_no_jsonl_advice(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([1, 2], pa.int64())}), tmp_path / "int.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    for name, said in (("int.parquet", "all 2 records were bad"), ("empty.parquet", "holds no record")):
        p = tokenize(tmp_path / name, "-o", tmp_path / f"out-{name}")
        assert p.returncode == 1 and said in p.stderr and "JSON" not in p.stderr, p.stderr
    (tmp_path / "array.jsonl").write_bytes(b"[1]\n")  # a JSONL input keeps its advice
    p = tokenize(tmp_path / "array.jsonl", "-o", tmp_path / "out-jsonl")
    assert p.returncode == 1 and "JSONL wants one JSON object a line" in p.stderr


def test_the_tokenizer_is_its_content_not_its_path(tmp_path, kjv):
    from support.data import GPT2_JSON

    (tmp_path / "in.jsonl").write_bytes(b"".join(kjv_lines(kjv)[:30]))
    shutil.copy(GPT2_JSON, tmp_path / "tok.json")
    shutil.copy(GPT2_JSON, tmp_path / "copy.json")
    assert tokenize("in.jsonl", "-o", "out", "--tokenizer", "tok.json", cwd=tmp_path).returncode == 0
    for spelling in ("./tok.json", str(tmp_path / "tok.json"), "copy.json"):
        p = tokenize("in.jsonl", "-o", "out", "--tokenizer", spelling, cwd=tmp_path)
        assert p.returncode == 0 and "already complete" in p.stdout, (spelling, p.stderr)
    p = tokenize("in.jsonl", "-o", "out", cwd=tmp_path)  # another tokenizer: both named
    assert p.returncode == 2 and "other settings (tokenizer):" in p.stderr and '"bytes"' in p.stderr
    assert "sha256:" + __import__("hashlib").sha256(open(GPT2_JSON, "rb").read()).hexdigest() in p.stderr


def test_a_dataset_of_before_with_the_tokenizers_path_in_its_settings_still_reruns(tmp_path, kjv):
    """Manifests written before the tokenizer's identity was its content hold its path: same file, same run."""
    from support.data import GPT2_JSON

    (tmp_path / "in.jsonl").write_bytes(b"".join(kjv_lines(kjv)[:20]))
    shutil.copy(GPT2_JSON, tmp_path / "tok.json")
    assert tokenize("in.jsonl", "-o", "out", "--tokenizer", "tok.json", cwd=tmp_path).returncode == 0
    manifest = json.loads((tmp_path / "out" / "index.json").read_text())
    manifest["provenance"]["settings"]["tokenizer"] = "tok.json"
    (tmp_path / "out" / "index.json").write_text(json.dumps(manifest))
    p = tokenize("in.jsonl", "-o", "out", "--tokenizer", "./tok.json", cwd=tmp_path)
    assert p.returncode == 0 and "already complete" in p.stdout, p.stderr


def test_a_refused_rerun_names_each_setting_with_both_values(tmp_path, kjv):
    p = tokenize(kjv, "-o", tmp_path / "out", "--shard-size", "1MB")
    assert p.returncode == 0, p.stderr
    p = tokenize(kjv, "-o", tmp_path / "out", "--shard-size", "2MB", "--val-fraction", "0.1")
    assert p.returncode == 2
    assert "other settings (shard_size, val_fraction):" in p.stderr
    assert "shard_size was 1048576, now 2097152" in p.stderr and "val_fraction was 0.0, now 0.1" in p.stderr


@pytest.mark.parametrize("out", ["out.json", "out.json/"])
def test_an_output_folder_named_like_a_manifest_is_refused_before_any_work(tmp_path, kjv, out):
    p = tokenize(kjv, "-o", tmp_path / out)
    assert p.returncode == 2 and "name the folder without .json" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out.json").exists()


def test_ids_are_tokenizers_own_with_special_token_strings_read_as_text(tmp_path, kjv):
    """README's exactness claim, as it is stated there: the ids of every document are `tokenizers`' own
    `encode(text, add_special_tokens=False)` with `encode_special_tokens=True` (a special token's string inside
    a document is ordinary text), then the EOS; with `tokenizers`' defaults the documents holding such a
    string would differ, and only those."""
    from tokenizers import Tokenizer

    from support.data import GPT2_JSON
    from dataflow import StreamingDataset

    texts = [json.loads(line)["text"] for line in kjv_lines(kjv)[:200]]
    texts += ["a<|endoftext|>b", "<|endoftext|>", "end of text <|endoftext|>\n\n<|endoftext|> again"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
    p = tokenize(tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", GPT2_JSON)
    assert p.returncode == 0, p.stderr
    got = {d["id"]: d["tokens"].tolist() for d in StreamingDataset(str(tmp_path / "out"), shuffle=False)}
    as_text, parsed = Tokenizer.from_file(str(GPT2_JSON)), Tokenizer.from_file(str(GPT2_JSON))
    as_text.encode_special_tokens = True
    eos = as_text.token_to_id("<|endoftext|>")
    for i, text in enumerate(texts):
        assert got[str(i)] == as_text.encode(text, add_special_tokens=False).ids + [eos]
        differs = parsed.encode(text, add_special_tokens=False).ids + [eos] != got[str(i)]
        assert differs == ("<|endoftext|>" in text)
