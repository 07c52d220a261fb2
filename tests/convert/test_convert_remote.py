"""`dataflow convert -o URL`: every direction writes to the object store itself (staged locally, uploaded when
whole, the manifest or the .idx last), byte for byte what a local -o gets; no local folder named after the URL's
scheme is ever made; remote inputs are refused in one line."""

from __future__ import annotations

import os
import uuid

import fsspec
import numpy as np
import pytest
from support.convert import convert, one_line_error
from support.s3_server import moto_s3

from dataflow.cli import main

EOS = 256  # the bytes tokenizer's


def flat_file(path, docs: int, seed: int) -> str:
    """A nanoGPT file of `docs` byte documents, each ending with EOS."""
    rng = np.random.default_rng(seed)
    parts = [np.append(rng.integers(0, 256, size=int(rng.integers(1, 400))), EOS) for _ in range(docs)]
    np.concatenate(parts).astype(np.uint16).tofile(path)
    return str(path)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """cwd = a fresh folder holding train.bin and its dataset `ds`; the cache (where remote outputs are staged)
    in it too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "cache"))
    flat_file(tmp_path / "train.bin", 300, 0)
    assert main(["convert", "--from", "nanogpt", "train.bin", "-o", "ds", "--tokenizer", "bytes",
                 "--shard-size", "16KB", "--no-progress"]) == 0
    return tmp_path


@pytest.fixture
def mem():
    """A fresh memory:// root, removed afterwards (the memory filesystem is one per process)."""
    root = f"memory://convert-{uuid.uuid4().hex[:8]}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


# (convert arguments but -o, the outputs' names under -o's location) of each direction
DIRECTIONS = {
    "from nanogpt": (["--from", "nanogpt", "train.bin", "--tokenizer", "bytes", "--shard-size", "16KB"], "ds2"),
    "to megatron": (["--to", "megatron", "ds"], "mg"),
    "to nanogpt": (["--to", "nanogpt", "ds"], "flat.bin"),
}


def outputs(root: str, name: str) -> dict[str, bytes]:
    """Every file a conversion wrote as `name` under `root` (a local folder or a URL): relative name -> bytes."""
    fs, base = fsspec.core.url_to_fs(root if "://" in root else os.path.abspath(root))
    found = {}
    for path in fs.find(base):
        rel = path[len(base.rstrip("/")) + 1:]
        if rel == name or rel.startswith((name + "/", name + ".")):
            found[rel] = fs.cat_file(path)
    return found


def no_scheme_folder(where) -> None:
    """No local folder named after a URL scheme (`memory:`, `s3:`, `file:`, `gs:`) anywhere under `where`."""
    made = [os.path.join(d, n) for d, dirs, _ in os.walk(where) for n in dirs if n.endswith(":")]
    assert not made, made


def staging_empty(work) -> None:
    staging = work / "cache" / "convert-staging"
    assert not staging.exists() or not os.listdir(staging), os.listdir(staging)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_each_direction_writes_to_the_url_what_a_local_output_gets(work, mem, capsys, direction):
    args, name = DIRECTIONS[direction]
    code, _, err = convert(capsys, *args, "-o", f"{work}/local/{name}")
    assert code == 0, err
    code, out, err = convert(capsys, *args, "-o", f"{mem}/{name}")
    assert code == 0, err
    assert f"{mem}/{name}" in out
    want = outputs(str(work / "local"), name)
    assert want and outputs(mem, name) == want  # the same files, byte for byte
    no_scheme_folder(work)
    staging_empty(work)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_file_urls_are_local_paths(work, capsys, direction):
    args, name = DIRECTIONS[direction]
    code, _, err = convert(capsys, *args, "-o", f"file://{work}/viaurl/{name}")
    assert code == 0, err
    assert convert(capsys, *args, "-o", f"{work}/plain/{name}")[0] == 0
    assert outputs(str(work / "viaurl"), name) == outputs(str(work / "plain"), name) != {}
    no_scheme_folder(work)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_an_output_at_a_url_is_replaced_only_with_overwrite(work, mem, capsys, direction):
    args, name = DIRECTIONS[direction]
    assert convert(capsys, *args, "-o", f"{mem}/{name}")[0] == 0
    before = outputs(mem, name)
    code, _, err = convert(capsys, *args, "-o", f"{mem}/{name}")
    one_line_error(err, code, 2, f"{mem}/{name}", "exists", "--overwrite")
    assert outputs(mem, name) == before
    # a smaller input, replacing the output: what remains is exactly the new conversion's
    flat_file(work / "train.bin", 40, 1)
    assert main(["convert", "--from", "nanogpt", "train.bin", "-o", "ds", "--tokenizer", "bytes", "--shard-size",
                 "2KB", "--overwrite", "--no-progress"]) == 0
    assert convert(capsys, *args, "-o", f"{work}/local/{name}")[0] == 0
    code, _, err = convert(capsys, *args, "-o", f"{mem}/{name}", "--overwrite")
    assert code == 0, err
    assert outputs(mem, name) == outputs(str(work / "local"), name) != before
    staging_empty(work)


def test_a_dataset_is_written_beside_other_files_but_never_over_one(work, mem, capsys):
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{mem}/ds2/notes.txt", b"mine")
    args, _ = DIRECTIONS["from nanogpt"]
    assert convert(capsys, *args, "-o", f"{mem}/ds2")[0] == 0
    assert fs.cat_file(f"{mem}/ds2/notes.txt") == b"mine" and fs.exists(f"{mem}/ds2/index.json")
    fs.pipe(f"{mem}/ds3/shard-00000.arrow", b"not a shard of ours")
    for overwrite in ([], ["--overwrite"]):
        code, _, err = convert(capsys, *args, "-o", f"{mem}/ds3", *overwrite)
        one_line_error(err, code, 2, f"{mem}/ds3", "shard-00000.arrow is there", "remove it")
        assert fs.find(f"{mem}/ds3") == [f"{mem[len('memory:/'):]}/ds3/shard-00000.arrow"]
    staging_empty(work)


def test_an_upload_that_fails_midway_is_one_line_and_leaves_nothing_of_it(work, mem, capsys, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    fs = fsspec.filesystem("memory")
    args, _ = DIRECTIONS["from nanogpt"]
    assert convert(capsys, *args, "-o", f"{mem}/ds2")[0] == 0  # an old dataset, then a failing replacement
    fs.pipe(f"{mem}/ds2/notes.txt", b"mine")
    real, puts = MemoryFileSystem.put_file, []

    def failing(self, lpath, rpath, **kwargs):
        puts.append(rpath)
        if len(puts) == 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(self, lpath, rpath, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put_file", failing)
    code, _, err = convert(capsys, *args, "-o", f"{mem}/ds2", "--overwrite")
    one_line_error(err, code, 1, f"{mem}/ds2", "uploading the dataset failed", "no dataset is there now", "rerun")
    assert fs.find(f"{mem}/ds2") == [f"{mem[len('memory:/'):]}/ds2/notes.txt"]  # nothing half old, half new
    staging_empty(work)
    monkeypatch.setattr(MemoryFileSystem, "put_file", real)
    assert convert(capsys, *args, "-o", f"{mem}/ds2", "--overwrite")[0] == 0  # the rerun finds no leftovers
    assert convert(capsys, *args, "-o", f"{work}/local/ds2")[0] == 0
    assert outputs(mem, "ds2") == {**outputs(str(work / "local"), "ds2"), "ds2/notes.txt": b"mine"}


def test_a_failed_conversion_leaves_the_old_output_at_the_url(work, mem, capsys):
    assert convert(capsys, "--to", "nanogpt", "ds", "-o", f"{mem}/flat.bin")[0] == 0
    before = outputs(mem, "flat.bin")
    shard = sorted(p for p in os.listdir(work / "ds") if p.startswith("shard-"))[-1]
    with open(work / "ds" / shard, "r+b") as f:
        f.truncate(100)  # the last shard damaged: the conversion fails after writing most of the file
    code, _, err = convert(capsys, "--to", "nanogpt", "ds", "-o", f"{mem}/flat.bin", "--overwrite")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert outputs(mem, "flat.bin") == before
    staging_empty(work)


@pytest.mark.parametrize("scheme, package", [("gs", "gcsfs"), ("az", "adlfs")])
def test_a_url_whose_backend_is_missing_is_one_line_and_no_folder(work, capsys, scheme, package):
    try:
        __import__(package)
        pytest.skip(f"{package} is installed")
    except ImportError:
        pass
    for args, name in DIRECTIONS.values():
        code, _, err = convert(capsys, *args, "-o", f"{scheme}://bucket/{name}")
        one_line_error(err, code, 2, f"{scheme}://bucket/{name}", package)
    no_scheme_folder(work)


@pytest.mark.parametrize("kind, source", [("megatron", "s3://bucket/corpus_text_document"),
                                          ("nanogpt", "memory://bucket/train.bin"),
                                          ("megatron", "https://host/corpus_text_document.bin")])
def test_remote_inputs_are_refused_in_one_line(work, capsys, kind, source):
    code, _, err = convert(capsys, "--from", kind, source, "-o", "out", "--tokenizer", "bytes")
    one_line_error(err, code, 2, source, "local", "download")
    assert not (work / "out").exists()
    no_scheme_folder(work)


@pytest.fixture(scope="module")
def s3():
    with moto_s3("conv", endpoint_env=True) as (_, client):
        yield client


def test_all_three_directions_into_s3_read_back(work, s3, capsys):
    for args, name in DIRECTIONS.values():
        code, _, err = convert(capsys, *args, "-o", f"s3://conv/x/{name}")
        assert code == 0, err
        assert convert(capsys, *args, "-o", f"{work}/local/{name}")[0] == 0
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="conv", Prefix=f"x/{name}")["Contents"]}
        want = outputs(str(work / "local"), name)
        assert keys == {f"x/{k}" for k in want}
        assert all(s3.get_object(Bucket="conv", Key=f"x/{k}")["Body"].read() == v for k, v in want.items())
    capsys.readouterr()
    assert main(["verify", "s3://conv/x/ds2", "--no-progress"]) == 0
    assert "ok: 8 shards, 300 documents" in capsys.readouterr().out
    code, _, err = convert(capsys, "--to", "nanogpt", "ds", "-o", "s3://no-such-bucket/flat.bin")
    one_line_error(err, code, 2, "s3://no-such-bucket/flat.bin", "does not exist")
    assert main(["decode", "s3://conv/x/ds2", "--no-progress"]) == 0
    remote = capsys.readouterr().out
    assert main(["decode", "ds", "--no-progress"]) == 0 and capsys.readouterr().out == remote
    no_scheme_folder(work)


def test_an_input_named_twice_once_as_a_file_url_is_refused(work, capsys):
    code, _, err = convert(capsys, "--to", "nanogpt", "ds", f"file://{work}/ds", "-o", "flat.bin")
    one_line_error(err, code, 2, "the same input as ds")
    assert not (work / "flat.bin").exists()


@pytest.mark.parametrize("where", ["local", "url"])
def test_a_disk_that_fills_is_one_line(work, mem, capsys, monkeypatch, where):
    out = f"{mem}/flat.bin" if where == "url" else "flat.bin"

    def full(fd):  # what a write on a full disk raises: ENOSPC, with no file name
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    code, _, err = convert(capsys, "--to", "nanogpt", "ds", "-o", out)
    one_line_error(err, code, 1, out, "full", "staging folder" if where == "url" else "free space")
    assert not (work / "flat.bin").exists() and not fsspec.filesystem("memory").exists(f"{mem}/flat.bin")
    staging_empty(work)
