"""Workers write finished shards and the coordinator only orders them: the cut, the shards, the ids, the
validation split and the error log depend on the input and the output settings, never on --workers."""

from __future__ import annotations

import json
import pickle
import subprocess

import pytest
import zstandard

from support.cli import DATAFLOW, dataset_bytes
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`


@pytest.fixture(scope="module")
def anonymous(kjv, tmp_path_factory):
    """KJV without ids, with bad lines spread through it, in two files."""
    with open(kjv, "rb") as f:
        docs = [json.loads(x) for x in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()]
    lines = [json.dumps({"text": d["text"]}).encode() + b"\n" for d in docs]
    for at in (3, 250, 251, 700, 1000):
        lines.insert(at, b"{not json\n")
    folder = tmp_path_factory.mktemp("anonymous")
    (folder / "a.jsonl").write_bytes(b"".join(lines[:800]))
    (folder / "b.jsonl").write_bytes(b"".join(lines[800:]))
    return folder


def run(src, out, *extra):
    return run_dataflow("tokenize", src, "-o", out, "--no-progress", "--json", *extra)


def test_the_cut_and_the_bytes_do_not_depend_on_workers(kjv10, tmp_path):
    """The default unit size is a constant: 1, 2 and 3 workers cut the input the same way (before, the cut was
    sized to the workers) and write the same bytes."""
    summaries = []
    for w in (1, 2, 3):
        p = run(kjv10, tmp_path / f"w{w}", "--workers", w)
        assert p.returncode == 0, p.stderr
        summaries.append(json.loads(p.stdout))
    assert [s["units"] for s in summaries] == [2, 2, 2]
    assert dataset_bytes(tmp_path / "w1") == dataset_bytes(tmp_path / "w2") == dataset_bytes(tmp_path / "w3")


def test_a_shard_never_spans_two_bundles_nor_passes_the_shard_size(kjv, tmp_path):
    p = run(kjv, tmp_path / "big", "--unit-size", "256KB", "--shard-size", "1GB", "--workers", "2")
    big = json.loads((tmp_path / "big" / "index.json").read_text())
    assert p.returncode == 0 and len(big["shards"]) > 1  # a shard ends with its bundle, however large the limit
    p = run(kjv, tmp_path / "small", "--unit-size", "256KB", "--shard-size", "64KB", "--workers", "2")
    small = json.loads((tmp_path / "small" / "index.json").read_text())
    assert p.returncode == 0 and len(small["shards"]) > len(big["shards"])
    longest = max(len(json.loads(x)["text"].encode()) + 1 for x in
                  zstandard.ZstdDecompressor().stream_reader(open(kjv, "rb")).read().splitlines())
    # the limit holds up to the document that crosses it (uint16 tokens: 2 bytes each)
    assert all(2 * s["tokens"] < (64 << 10) + 2 * longest for s in small["shards"])


def test_ids_the_val_split_and_the_error_log_do_not_depend_on_workers(anonymous, tmp_path):
    for w in (1, 2, 3):
        p = run(anonymous, tmp_path / f"w{w}", "--workers", w, "--unit-size", "64KB", "--val-fraction", "0.2")
        assert p.returncode == 0, p.stderr
    assert dataset_bytes(tmp_path / "w1") == dataset_bytes(tmp_path / "w2") == dataset_bytes(tmp_path / "w3")
    logs = [(tmp_path / f"w{w}" / "_errors.jsonl").read_text() for w in (1, 2, 3)]
    assert logs[0] == logs[1] == logs[2]
    assert [(json.loads(e)["file"].rsplit("/", 1)[-1], json.loads(e)["line"]) for e in logs[0].splitlines()] == \
        [("a.jsonl", 4), ("a.jsonl", 251), ("a.jsonl", 252), ("a.jsonl", 701), ("b.jsonl", 201)]
    # a record without an id is named after the byte its line starts at: the line is there
    for split in ("train", "val"):
        back = subprocess.run([*DATAFLOW, "decode", str(tmp_path / "w2" / split)], capture_output=True,
                              text=True, check=True).stdout.splitlines()
        for record in map(json.loads, back[::50]):
            name, at = record["id"].rsplit("@", 1)
            with open(anonymous / name, "rb") as f:
                f.seek(int(at))
                assert json.loads(f.readline())["text"] == record["text"]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_max_errors_stops_at_the_same_record_for_any_workers(anonymous, tmp_path, workers):
    p = run(anonymous, tmp_path / "o", "--workers", workers, "--unit-size", "64KB", "--max-errors", "3")
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "a.jsonl line 701: invalid JSON" in p.stderr and "4 bad records" in p.stderr


def test_workers_hand_back_no_tokens(kjv, tmp_path, monkeypatch):
    """What the coordinator receives per bundle is a few hundred bytes, whatever the bundle's tokens."""
    from dataflow.preprocess import commit as commit_mod
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    sizes = []
    commit = commit_mod.commit_bundle

    def measured(result, *args, **kwargs):
        sizes.append((len(pickle.dumps(result)), result.tokens))
        return commit(result, *args, **kwargs)

    monkeypatch.setattr(commit_mod, "commit_bundle", measured)
    tokenize(TokenizeConfig(inputs=[str(kjv)], out=str(tmp_path / "o"), unit_bytes=256 << 10, workers=2,
                            progress=False))
    assert len(sizes) >= 16 and max(size for size, _ in sizes) < 4096 < min(tokens for _, tokens in sizes)


def test_a_journal_of_the_previous_version_is_refused_in_one_line(kjv10, tmp_path):
    from support import kill_points

    out = tmp_path / "o"
    args = ["tokenize", str(kjv10), "-o", out, "--no-progress", "--unit-size", "4MB", "--workers", "1"]
    assert subprocess.run(kill_points.command({"next_unit": 2}, *args), capture_output=True).returncode == -9
    journal = out / "_work" / "task-00000" / "journal.json"
    old = json.loads(journal.read_text())
    old.update(version=3, unit_bytes=4 << 20, splits={"train": {"shards": [], "next_index": 0, "file": None,
                                                                "spill": "", "spill_bytes": 0}})
    old.pop("shards")
    journal.write_text(json.dumps(old))
    p = subprocess.run([*DATAFLOW, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "journal version 3" in p.stderr and "--overwrite" in p.stderr


def test_small_files_share_a_shard_and_parquet_rows_keep_their_ids(tmp_path):
    """Consecutive small inputs are bundled (a folder of small files is not a shard per file), and a Parquet
    row group's worker knows its rows' numbers in the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"t{i:02d}.jsonl").write_text(json.dumps({"text": f"file {i}"}) + "\n")
    pq.write_table(pa.table({"text": [f"row {r}" for r in range(1000)]}), src / "u.parquet", row_group_size=100)
    for w in (1, 2):
        p = run(src, tmp_path / f"w{w}", "--workers", w, "--unit-size", "64KB")
        assert p.returncode == 0, p.stderr
    assert dataset_bytes(tmp_path / "w1") == dataset_bytes(tmp_path / "w2")
    assert len(json.loads((tmp_path / "w1" / "index.json").read_text())["shards"]) == 1
    back = subprocess.run([*DATAFLOW, "decode", str(tmp_path / "w2")], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    records = [json.loads(x) for x in back]
    assert records[0] == {"id": "t00.jsonl@0", "text": "file 0"}
    assert [r["id"] for r in records[30:]] == [f"u.parquet:{r}" for r in range(1000)]
    assert [r["text"] for r in records[30:]] == [f"row {r}" for r in range(1000)]


def test_a_workers_memory_does_not_grow_with_the_input(kjv, kjv10, tmp_path):
    """A worker holds one bundle's blocks and one shard's record batch: ten times the input, same peak."""
    child = ("import json, resource, sys\n"
             "from dataflow.preprocess.run import TokenizeConfig, tokenize\n"
             "tokenize(TokenizeConfig(inputs=[sys.argv[1]], out=sys.argv[2], workers=2, unit_bytes=1 << 20,\n"
             "                        shard_size='4MB', progress=False))\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    peaks = []
    for src in (kjv, kjv10):
        p = subprocess.run([DATAFLOW[0], "-c", child, str(src), str(tmp_path / src.name)], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        peaks.append(int(p.stdout.split()[-1]) / 1024)  # MB
    assert peaks[1] < peaks[0] + 40, peaks  # MB


def test_a_rerun_of_a_finished_run_is_a_summary_with_its_error_count(anonymous, tmp_path):
    assert run(anonymous, tmp_path / "o", "--unit-size", "64KB").returncode == 0
    p = run(anonymous, tmp_path / "o", "--unit-size", "64KB")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["notes"] == ["already complete: nothing to do"] and summary["errors"] == 5
