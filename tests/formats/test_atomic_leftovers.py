"""A write killed mid-way (kill -9: nothing runs its cleanup) leaves its hidden temp beside the target; the next
write of that target removes it, and never a temp another writer holds. Through `decode -o` and `convert` (files
and folders), as a user reruns them; the killed writer's temp is made as it leaves one (named, unlocked)."""

import fcntl
import os

import numpy as np
import pytest

from dataflow import ShardWriter, TokenizerMeta
from dataflow.formats.atomic import temp_beside
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`



def run(*args):
    p = run_dataflow(*args, "--no-progress")
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("leftovers") / "ds"
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    with ShardWriter(str(out), tokenizer_meta=meta) as w:
        for i in range(50):
            w.write(np.arange(i, i + 100, dtype=np.uint16) % 256, id=f"d{i}")
    return out


def abandoned(target, suffix=".tmp", folder=False):
    """What a writer of `target` killed with -9 leaves: its temp, no lock held on it."""
    path = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.k9x{suffix}")
    if folder:
        os.makedirs(os.path.join(path, "train"))
        open(os.path.join(path, "train", "shard-00000.arrow"), "wb").write(b"x" * 1000)
    else:
        open(path, "wb").write(b"x" * 1000)
    return path


def test_decode_removes_a_killed_decode_temp_but_not_a_live_one(dataset, tmp_path):
    out = tmp_path / "docs.jsonl"
    dead = abandoned(str(out))
    live, held = temp_beside(str(out))  # another writer of the same file, at work now
    try:
        run("decode", dataset, "-o", out)
        assert not os.path.exists(dead) and os.path.exists(live) and len(out.read_text().splitlines()) == 50
    finally:
        os.close(held)


def test_convert_removes_killed_temps_of_its_files_and_folders(dataset, tmp_path):
    prefix = tmp_path / "meg"
    dead = [abandoned(str(prefix)), abandoned(str(prefix))]
    run("convert", "--to", "megatron", dataset, "-o", prefix)
    assert not any(os.path.exists(p) for p in dead) and os.path.exists(str(prefix) + ".bin")
    back = tmp_path / "back"
    dead = [abandoned(str(back), folder=True), abandoned(str(back), ".old", folder=True)]
    run("convert", "--from", "megatron", prefix, "-o", back, "--tokenizer", "bytes")
    assert not any(os.path.exists(p) for p in dead) and (back / "index.json").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_temp_is_locked_while_written(tmp_path):
    path, held = temp_beside(str(tmp_path / "x.bin"))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        os.close(held)
