"""`dataflow tokenize`, `inspect`, `verify`, `decode` through the real CLI on real data."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dataflow.cli import main
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`



def kjv_docs(kjv):
    with open(kjv, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    return [json.loads(line) for line in data.splitlines()]


def run(*args, check=True):
    p = run_dataflow(*args)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {p.stderr}")
    return p


def test_tokenize_decode_round_trip_is_exact(tmp_path, kjv):
    out = tmp_path / "ds"
    p = run("tokenize", kjv, "-o", out, "--shard-size", "1MB", "--workers", "2", "--no-progress")
    assert "1,189 documents" in p.stdout
    decoded = tmp_path / "back.jsonl"
    run("decode", out, "-o", decoded)
    back = [json.loads(line) for line in decoded.read_text(encoding="utf-8").splitlines()]
    want = kjv_docs(kjv)
    assert [d["id"] for d in back] == [d["id"] for d in want]
    assert all(a["text"] == b["text"] for a, b in zip(back, want))
    index = json.loads((out / "index.json").read_text())
    assert index["totals"]["documents"] == 1189 and len(index["shards"]) >= 3
    assert index["tokenizer"] == {"kind": "bytes", "name": "bytes", "vocab_size": 257, "eos_id": 256,
                                  "sha256": None, "file": None,
                                  "framing": {"bos_id": None, "eos_id": 256, "special_tokens": "text"}}


def test_verify_detects_flipped_byte_and_truncation(tmp_path, kjv):
    out = tmp_path / "ds"
    run("tokenize", kjv, "-o", out, "--shard-size", "1MB", "--no-progress")
    assert run("verify", out).returncode == 0
    shard1, shard2 = out / "shard-00001.arrow", out / "shard-00002.arrow"
    data = bytearray(shard1.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard1.write_bytes(bytes(data))
    shard2.write_bytes(shard2.read_bytes()[:-100])
    p = run("verify", out, check=False)
    assert p.returncode == 1
    assert "shard-00001.arrow" in p.stderr and "corrupt" in p.stderr
    assert "shard-00002.arrow" in p.stderr and "truncated" in p.stderr
    assert "shard-00000.arrow" not in p.stderr


def test_inputs_gzip_parquet_txt_and_ids(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with gzip.open(src / "a.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "alpha"}) + "\n" + json.dumps({"text": "beta", "id": "b"}) + "\n")
    pq.write_table(pa.table({"text": ["gamma", "delta"]}), src / "c.parquet")
    (src / "d.txt").write_text("epsilon\nzeta")
    out = tmp_path / "ds"
    run("tokenize", src, "-o", out, "--no-progress")
    back = [json.loads(line) for line in run("decode", out).stdout.splitlines()]
    # a JSONL record without an id is named after the byte its line starts at in the decompressed file
    assert back == [{"id": "a.jsonl.gz@0", "text": "alpha"}, {"id": "b", "text": "beta"},
                    {"id": "c.parquet:0", "text": "gamma"}, {"id": "c.parquet:1", "text": "delta"},
                    {"id": "d.txt", "text": "epsilon\nzeta"}]


def test_bad_records_are_logged_and_limited(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = ['{"text": "ok"}', "{broken", '{"body": "no text"}', '{"text": 5}', '"\\ud800"',
             '{"text": "lone \\ud800 surrogate"}', '{"text": "fine"}']
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "ds"
    p = run("tokenize", src, "-o", out, "--no-progress", "--json")
    assert json.loads(p.stdout)["errors"] == 5
    errors = [json.loads(line) for line in (out / "_errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errors] == [2, 3, 4, 5, 6]
    assert "invalid JSON" in errors[0]["reason"] and "missing field 'text'" in errors[1]["reason"]
    assert "undecodable" in errors[4]["reason"]
    p = run("tokenize", src, "-o", tmp_path / "ds2", "--no-progress", "--max-errors", "2", check=False)
    assert p.returncode == 1
    assert "line 4" in p.stderr and "--max-errors 2" in p.stderr and "Traceback" not in p.stderr


def test_validation_split_is_deterministic_and_complete(tmp_path, kjv):
    out = tmp_path / "ds"
    run("tokenize", kjv, "-o", out, "--val-fraction", "0.1", "--seed", "3", "--no-progress")
    train = json.loads((out / "train" / "index.json").read_text())["totals"]["documents"]
    val = json.loads((out / "val" / "index.json").read_text())["totals"]["documents"]
    assert train + val == 1189 and 60 < val < 180
    assert run("verify", out / "val").returncode == 0
    p = run("decode", out, check=False)
    assert p.returncode == 2 and "train" in p.stderr and "val" in p.stderr  # a usage mistake: pass one split


def test_rerun_with_other_settings_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    out = tmp_path / "ds"
    run("tokenize", src, "-o", out, "--no-progress")
    p = run("tokenize", src, "-o", out, "--no-progress", "--compression", "none", check=False)
    assert p.returncode == 2 and "compression" in p.stderr and "--overwrite" in p.stderr
    run("tokenize", src, "-o", out, "--no-progress", "--compression", "none", "--overwrite")


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["tokenize", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("a,b")
    assert main(["tokenize", str(tmp_path / "x.csv"), "-o", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "unsupported input type" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["tokenize"])
    assert e.value.code == 2


def test_inspect_shows_summary_and_documents(tmp_path, kjv):
    out = tmp_path / "ds"
    run("tokenize", kjv, "-o", out, "--no-progress")
    p = run("inspect", out, "--decode", "1")
    assert "1,189 documents" in p.stdout and "shard-00000.arrow" in p.stdout and "Genesis 1" in p.stdout
    info = json.loads(run("inspect", out, "--json").stdout)
    assert info["totals"]["tokens"] == sum(s["tokens"] for s in info["shards"])


def test_remote_inputs_over_http_and_fsspec_memory(tmp_path, kjv):
    import functools
    import http.server
    import threading

    import fsspec

    from dataflow.preprocess.run import TokenizeConfig, tokenize

    want = kjv_docs(kjv)
    plain = b"".join(json.dumps(d).encode() + b"\n" for d in want)
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "kjv.jsonl").write_bytes(plain)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "srv"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # a server without range requests: the file is streamed as one unit
        url = f"http://127.0.0.1:{server.server_address[1]}/kjv.jsonl"
        run("tokenize", url, "-o", tmp_path / "http", "--unit-size", "1MB", "--workers", "2", "--no-progress")
    finally:
        server.shutdown()
    with fsspec.open("memory://corpus/part-a.jsonl", "wb") as f:  # seekable: cut into byte ranges
        f.write(plain)
    tokenize(TokenizeConfig(inputs=["memory://corpus/*.jsonl"], out=str(tmp_path / "mem"), unit_bytes=1 << 20,
                            workers=1, progress=False))
    for out in ("http", "mem"):
        back = [json.loads(line) for line in run("decode", tmp_path / out).stdout.splitlines()]
        assert [d["text"] for d in back] == [d["text"] for d in want]
