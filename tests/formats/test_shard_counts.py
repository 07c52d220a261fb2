"""A manifest's numbers are checked: bounded when it is read, against each shard when the shard is opened
(the loader, `decode`, `inspect --decode`, `verify`), Arrow and tar shards alike."""

import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

from dataflow import FormatError, ShardWriter, StreamingDataset, TokenizerMeta
from dataflow.cli import main
from dataflow.formats.manifest import read_manifest

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
FORMATS = [("arrow", "zstd"), ("arrow", "none"), ("tar", "zstd"), ("tar", "none")]


def write(out, fmt: str, compression: str, docs: int = 21, shard_size: str = "1GB") -> str:
    rng = np.random.default_rng(1)
    with ShardWriter(str(out), tokenizer_meta=BYTES, format=fmt, compression=compression, shard_size=shard_size) as w:
        for i in range(docs):
            w.write(rng.integers(0, 256, size=int(rng.integers(20, 200))).astype(np.uint16), id=f"d{i}")
    return str(out)


def edit(path: str, change) -> None:
    index = os.path.join(path, "index.json")
    d = json.loads(pathlib.Path(index).read_text())
    change(d)
    for key in ("documents", "tokens", "bytes"):  # totals kept consistent: only the shard entry lies
        d["totals"][key] = sum(s[key] for s in d["shards"])
    pathlib.Path(index).write_text(json.dumps(d))


def cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


READERS = ["loader: documents", "loader: windows", "loader: no decoded copy", "decode", "inspect --decode", "verify"]


def read(path: str, reader: str, capsys, tmp_path) -> str:
    """The error `reader` gives for the dataset (the test fails when it reads it without one)."""
    if reader.startswith("loader"):
        kw = {"loader: documents": {}, "loader: windows": {"seq_len": 16},
              "loader: no decoded copy": {"decode_once": False}}[reader]
        with pytest.raises(FormatError) as e:
            for _ in StreamingDataset(path, shuffle=False, **kw):
                pass
        return str(e.value)
    argv = {"decode": ["decode", path, "--no-progress", "-o", str(tmp_path / "out.jsonl")],
            "inspect --decode": ["inspect", path, "--decode", "1"], "verify": ["verify", path, "--no-progress"]}[reader]
    code, err = cli(capsys, *argv)
    assert code == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("fmt,compression", FORMATS)
@pytest.mark.parametrize("field,delta", [("documents", -20), ("documents", -1), ("documents", 5), ("tokens", -1),
                                         ("tokens", 100)])
@pytest.mark.parametrize("reader", READERS)
def test_counts_that_disagree_with_the_shard_are_refused_when_it_is_opened(tmp_path, capsys, fmt, compression,
                                                                           field, delta, reader):
    path = write(tmp_path / "d", fmt, compression)
    real = read_manifest(path).shards[0]
    edit(path, lambda d: d["shards"][0].update({field: d["shards"][0][field] + delta}))
    err = read(path, reader, capsys, tmp_path)
    said = {"documents": real.documents, "tokens": real.tokens, field: getattr(real, field) + delta}
    assert f"holds {real.documents} documents / {real.tokens} tokens" in err
    assert f"manifest says {said['documents']} / {said['tokens']}" in err
    assert not (tmp_path / "out.jsonl").exists()  # decode -o writes nothing rather than part of the dataset


def rewrite_layout(path: str, layout: str) -> None:
    """Overwrite an Arrow shard's record batch layout (schema metadata, in the header and the footer) in
    place, and make the manifest agree with the file's new bytes."""
    shard = read_manifest(path).shards[0]
    name = os.path.join(path, shard.path)
    data = pathlib.Path(name).read_bytes()
    old = json.dumps([[shard.documents, shard.tokens]], separators=(",", ":")).encode()
    assert data.count(old) == 2
    at = data.find(old)
    width = len(old) + len(data[at + len(old):]) - len(data[at + len(old):].lstrip(b" "))  # the padded field
    assert len(layout) <= width
    data = data.replace(data[at:at + width], layout.encode().ljust(width))
    pathlib.Path(name).write_bytes(data)
    edit(path, lambda d: d["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("layout,message", [
    ("[[20,{tokens}]]", "record batch 0 holds 21 documents / {tokens} tokens, its layout says 20 / {tokens}"),
    ("[[21,{less}]]", "record batch 0 holds 21 documents / {tokens} tokens, its layout says 21 / {less}"),
    ("[[21,99999999999999999999999]]", "record batch layout"),
    ("[[21,-5]]", "record batch layout"),
])
@pytest.mark.parametrize("reader", ["loader: documents", "loader: windows", "decode", "verify"])
def test_an_arrow_layout_that_disagrees_with_its_record_batches_is_refused(tmp_path, capsys, compression, layout,
                                                                           message, reader):
    path = write(tmp_path / "d", "arrow", compression)
    tokens = read_manifest(path).shards[0].tokens
    layout = layout.format(tokens=tokens, less=tokens - 7)
    rewrite_layout(path, layout)
    said = json.loads(layout)[0]
    if all(0 <= x < 2**53 for x in said):  # the manifest agrees with the layout: only the record batch tells
        edit(path, lambda d: d["shards"][0].update(documents=said[0], tokens=said[1]))
    assert message.format(tokens=tokens, less=tokens - 7) in read(path, reader, capsys, tmp_path)


@pytest.mark.parametrize("field,value", [("tokens", 2**63), ("tokens", 2**53 + 1), ("documents", 2**64),
                                         ("bytes", 2**63), ("tokens", -1), ("documents", 1.5), ("tokens", True),
                                         ("documents", "21")])
def test_manifest_counts_out_of_range_are_refused_when_it_is_read(tmp_path, capsys, field, value):
    path = write(tmp_path / "d", "arrow", "zstd")
    index = os.path.join(path, "index.json")
    d = json.loads(pathlib.Path(index).read_text())
    d["shards"][0][field] = value
    pathlib.Path(index).write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"counts that are not integers in \[0, 2\^53\]"):
        read_manifest(path)
    with pytest.raises(FormatError, match=r"counts that are not integers in \[0, 2\^53\]"):
        StreamingDataset(path, seq_len=16)
    code, err = cli(capsys, "inspect", path)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "2^53" in err


def test_shard_counts_whose_sum_overflows_are_refused(tmp_path):
    path = write(tmp_path / "d", "arrow", "zstd", docs=200, shard_size="4KB")
    n = len(read_manifest(path).shards)
    assert n >= 3
    edit(path, lambda d: [s.update(tokens=2**53 // 2) for s in d["shards"]])
    with pytest.raises(FormatError, match=rf"its shards hold {n * (2**53 // 2):,} tokens in all, more than 2\^53"):
        read_manifest(path)


@pytest.mark.parametrize("totals", [{"tokens": 1}, {"documents": 22}, {"shards": 2}, {"tokens": "2970"}])
def test_verify_reports_totals_that_are_not_the_sums_of_the_shards(tmp_path, capsys, totals):
    path = write(tmp_path / "d", "tar", "none")
    index = os.path.join(path, "index.json")
    d = json.loads(pathlib.Path(index).read_text())
    d["totals"].update(totals)
    pathlib.Path(index).write_text(json.dumps(d))
    code, err = cli(capsys, "verify", path, "--no-progress")
    assert code == 1 and "BAD index.json: its totals" in err and "are not the sums of its shard entries" in err
    assert len(list(StreamingDataset(path))) == 21  # readers never use the totals: they still load
