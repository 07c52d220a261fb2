"""`dataflow decode -o`: a regular file path (or `-` for standard output), under convert's rule for outputs:
an existing file is replaced only with --overwrite, a device, FIFO or socket never; the file appears whole or not
at all; an unwritable place is one line; a URL is written there, not to a local folder named after its scheme."""

from __future__ import annotations

import json
import os
import stat
import uuid

import fsspec
import pytest

from dataflow import ShardWriter, TokenizerMeta
from dataflow.cli import main

TEXTS = [f"document {i}: " + "word " * (i % 50) for i in range(200)]


@pytest.fixture
def ds(tmp_path):
    """A bytes-tokenized dataset of TEXTS in several shards."""
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    with ShardWriter(str(tmp_path / "ds"), tokenizer_meta=meta, shard_size="2KB") as w:
        for i, text in enumerate(TEXTS):
            w.write(list(text.encode()), id=f"d{i}")
    return tmp_path / "ds"


def decode(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["decode", *map(str, argv), "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(result: tuple[int, str, str], expected: int, *words: str) -> None:
    """`decode` failed with exit `expected`, saying why in one line that names `words` (no traceback)."""
    code, _, err = result
    assert code == expected and err.count("\n") == 1 and err.startswith("dataflow decode: error: "), err
    assert all(w in err for w in words), (words, err)


def texts_of(jsonl: str) -> list[str]:
    return [json.loads(line)["text"] for line in jsonl.splitlines()]


def make_node(path, kind: str) -> None:
    """A node of `kind` at `path`: a FIFO, or a copy of /dev/full's character device (root only). The tests never
    aim at /dev itself: code that replaces its target would replace the machine's /dev/full."""
    if kind == "fifo":
        os.mkfifo(path)
        return
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))


@pytest.mark.parametrize("kind", ["character device", "fifo"])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_device_or_fifo_is_never_replaced(ds, tmp_path, capsys, kind, overwrite):
    node = tmp_path / "full.jsonl"
    make_node(node, kind)
    before = os.stat(node)
    refused(decode(capsys, ds, "-o", node, *overwrite), 2, str(node), "not a regular file", "- for standard output")
    after = os.stat(node)
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)
    assert sorted(os.listdir(tmp_path)) == ["ds", "full.jsonl"]  # and no temp file beside it


def test_an_existing_file_is_replaced_only_with_overwrite(ds, tmp_path, capsys):
    out = tmp_path / "back.jsonl"
    out.write_text("mine\n")
    refused(decode(capsys, ds, "-o", out), 2, str(out), "exists", "--overwrite")
    assert out.read_text() == "mine\n"
    code, _, err = decode(capsys, ds, "-o", out, "--overwrite")
    assert code == 0, err
    assert texts_of(out.read_text()) == TEXTS
    assert sorted(os.listdir(tmp_path)) == ["back.jsonl", "ds"]  # no temp file left beside it


def test_dash_is_standard_output(ds, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = decode(capsys, ds, "-o", "-")
    assert code == 0, err
    assert texts_of(out) == TEXTS and not (tmp_path / "-").exists()


@pytest.mark.parametrize("where", ["sysfs", "under a file", "missing folder in sysfs"])
def test_a_place_that_cannot_be_written_is_one_line(ds, tmp_path, capsys, where):
    (tmp_path / "plain.txt").write_text("x")
    target = {"sysfs": "/sys/decoded.jsonl", "under a file": tmp_path / "plain.txt" / "decoded.jsonl",
              "missing folder in sysfs": "/sys/dataflow-nowhere/decoded.jsonl"}[where]
    refused(decode(capsys, ds, "-o", target), 2, str(target), "cannot write there")
    assert not os.path.exists(target)


def test_a_failed_decode_leaves_the_old_file_in_place(ds, tmp_path, capsys):
    out = tmp_path / "back.jsonl"
    out.write_text("the good one\n")
    last = sorted(p for p in os.listdir(ds) if p.startswith("shard-"))[-1]
    with open(ds / last, "r+b") as f:
        f.truncate(64)  # most documents decode, then the last shard fails
    code, _, err = decode(capsys, ds, "-o", out, "--overwrite")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert out.read_text() == "the good one\n"
    assert sorted(os.listdir(tmp_path)) == ["back.jsonl", "ds"]


def test_decode_to_a_url_writes_it_there(ds, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "cache"))
    url = f"memory://decode-{uuid.uuid4().hex[:8]}/back.jsonl"
    fs = fsspec.filesystem("memory")
    try:
        code, _, err = decode(capsys, ds, "-o", url)
        assert code == 0, err
        assert texts_of(fs.cat_file(url).decode()) == TEXTS
        refused(decode(capsys, ds, "-o", url), 2, url, "exists", "--overwrite")
    finally:
        fs.rm(url.rsplit("/", 1)[0], recursive=True)
    assert not any(name.endswith(":") for name in os.listdir(tmp_path))  # no local `memory:` folder


def test_convert_refuses_a_fifo_as_decode_does(ds, tmp_path, capsys):
    pipe = tmp_path / "train.bin"
    os.mkfifo(pipe)
    capsys.readouterr()
    code = main(["convert", "--to", "nanogpt", str(ds), "-o", str(pipe), "--overwrite", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "a FIFO, not a regular file" in err and err.count("\n") == 1, err
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_a_disk_that_fills_is_one_line_and_keeps_the_old_file(ds, tmp_path, capsys, monkeypatch):
    out = tmp_path / "back.jsonl"
    out.write_text("the good one\n")

    def full(fd):  # what a write on a full disk raises: ENOSPC, with no file name
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    refused(decode(capsys, ds, "-o", out, "--overwrite"), 1, str(out), "disk is full", "untouched")
    assert out.read_text() == "the good one\n"
    assert sorted(os.listdir(tmp_path)) == ["back.jsonl", "ds"]
