"""Hostile manifests (the reliability issue's items 10 and 13): a shard listed twice, a manifest that never
ends or is nested past any parser's depth. `verify`, `inspect`, `decode` and the loader each refuse them in
one line as the manifest is read: nothing is served twice, nothing is read without bound, no traceback."""

from __future__ import annotations

import json
import os
import time
import tracemalloc

import numpy as np
import pytest

from dataflow import FormatError, ShardWriter, StreamingDataset, TokenizerMeta
from dataflow.cli import main
from dataflow.formats import manifest as manifest_mod
from dataflow.formats.manifest_bounds import manifest_max_bytes
from dataflow.formats import remote
from support.http_files import _Files as Files
from support.http_files import serve
from support.data import edit_manifest

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
READERS = ("verify", "inspect", "decode")


@pytest.fixture
def ds(tmp_path) -> str:
    """A small dataset of several shards."""
    out = tmp_path / "ds"
    with ShardWriter(str(out), tokenizer_meta=BYTES, shard_size="4KB") as w:
        for i in range(30):
            w.write((np.arange(i, i + 400) % 256).astype(np.uint16), id=f"d{i}")
    return str(out)


def edit(path: str, change) -> None:
    """`change` the manifest of `path`, its totals kept the sums of its entries (as a careful forger would)."""
    def forged(d):
        change(d)
        d["totals"] = {k: sum(s[k] for s in d["shards"]) for k in ("documents", "tokens", "bytes")}
        d["totals"]["shards"] = len(d["shards"])

    edit_manifest(path, forged)


def refused(capsys, path: str, *needles: str) -> None:
    """Every reader refuses `path` in one line (exit 1) that holds `needles`; the loader raises FormatError."""
    for command in READERS:
        capsys.readouterr()
        rc = main([command, path] + (["--no-progress"] if command != "inspect" else []))
        out, err = capsys.readouterr()
        assert rc == 1 and err.count("\n") == 1 and all(n in err for n in needles), (command, rc, err)
        assert not out
    with pytest.raises(FormatError) as e:
        StreamingDataset(path, seq_len=8)
    assert all(n in str(e.value) for n in needles) and "\n" not in str(e.value)


# -- item 10: one shard listed twice ---------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["{}", "./{}", ".//{}", "././{}"])
def test_a_shard_listed_twice_is_refused_in_every_spelling(ds, capsys, spelling):
    def twice(d):
        first = d["shards"][0]
        d["shards"].append({**first, "path": spelling.format(first["path"])})

    edit(ds, twice)
    name = json.load(open(os.path.join(ds, "index.json")))["shards"][0]["path"]
    refused(capsys, ds, f"lists shard {name} twice", "entries 1 and")


def test_a_shard_in_a_subfolder_spelled_with_doubled_slashes_is_the_same_shard(ds, capsys):
    os.makedirs(os.path.join(ds, "sub"))

    def into_sub(d):
        first = d["shards"][0]
        os.replace(os.path.join(ds, first["path"]), os.path.join(ds, "sub", first["path"]))
        first["path"] = "sub/" + first["path"]
        d["shards"].insert(1, {**first, "path": first["path"].replace("sub/", "sub//./")})

    edit(ds, into_sub)
    refused(capsys, ds, "twice", "entries 1 and 2")


def test_a_path_through_dot_dot_is_refused_before_it_can_name_a_shard_again(ds, capsys):
    edit(ds, lambda d: d["shards"].append({**d["shards"][0], "path": "a/../" + d["shards"][0]["path"]}))
    refused(capsys, ds, "must be relative and stay inside the dataset")


def test_distinct_names_that_decode_alike_stay_distinct_shards(ds):
    """`%41.arrow` and `A.arrow` are two files (readers never percent-decode a name): not a duplicate."""
    def rename(d):
        for shard, name in zip(d["shards"], ["%41.arrow", "A.arrow"]):
            os.replace(os.path.join(ds, shard["path"]), os.path.join(ds, name))
            shard["path"] = name

    edit(ds, rename)
    assert main(["verify", ds, "--no-progress"]) == 0


# -- item 13: a manifest without end, or nested past any parser's depth ---------------------------------------

@pytest.mark.parametrize("depth,where", [(100_000, "provenance"), (100_000, "shards"), (500, "provenance")])
def test_a_deeply_nested_manifest_is_one_format_error(ds, capsys, depth, where):
    index = os.path.join(ds, "index.json")
    d = json.load(open(index))
    if where == "shards":
        d["shards"][0]["path"] = "@@"
    else:
        d["provenance"] = {"note": "@@"}
    with open(index, "w") as f:
        f.write(json.dumps(d).replace('"@@"', "[" * depth + "]" * depth))
    refused(capsys, ds, "index.json", "nested more than")


def test_a_manifest_larger_than_the_bound_is_refused_before_it_is_parsed(ds, capsys, monkeypatch):
    size = os.path.getsize(os.path.join(ds, "index.json"))
    monkeypatch.setenv("DATAFLOW_MANIFEST_MAX_BYTES", str(size - 1))
    refused(capsys, ds, "index.json", f"more than {size - 1:,} bytes", "DATAFLOW_MANIFEST_MAX_BYTES")
    monkeypatch.setenv("DATAFLOW_MANIFEST_MAX_BYTES", str(size))  # the bound itself is allowed
    assert main(["verify", ds, "--no-progress"]) == 0


def test_a_manifest_that_is_a_link_to_an_endless_device_is_refused(ds, capsys, monkeypatch):
    os.remove(os.path.join(ds, "index.json"))
    os.symlink("/dev/zero", os.path.join(ds, "index.json"))
    monkeypatch.setenv("DATAFLOW_MANIFEST_MAX_BYTES", "1MB")
    refused(capsys, ds, "index.json", "more than 1,048,576 bytes")


def test_the_default_bound_holds_a_manifest_of_a_million_shards():
    """The bound is generous: a million shards of a merged run (the longest paths and counts tokenize writes),
    written as `write_manifest` writes them, take a quarter of it at most."""
    entry = {"path": "part-00000/shard-000000-000.arrow", "documents": 10**9, "tokens": 10**12,
             "bytes": 10**10, "sha256": "a" * 64}
    per_shard = len(json.dumps({"shards": [entry] * 100}, indent=1)) / 100
    assert 1_000_000 * per_shard * 4 <= manifest_max_bytes()


@pytest.mark.heavy
def test_a_manifest_of_a_million_shards_loads(tmp_path):
    d = {"version": 1, "tokenizer": {"kind": "bytes", "name": "bytes", "vocab_size": 257, "eos_id": 256},
         "dtype": "uint16", "format": "arrow", "compression": "zstd",
         "shards": [{"path": f"part-{i // 1000:05d}/shard-{i:06d}-000.arrow", "documents": 10**6, "tokens": 10**9,
                     "bytes": 10**9, "sha256": f"{i:064x}"} for i in range(1_000_000)]}
    (tmp_path / "index.json").write_text(json.dumps(d, indent=1))
    assert len(manifest_mod.read_manifest(str(tmp_path)).shards) == 1_000_000


class Endless(Files):
    """`index.json` answered by a body that never ends (a manifest's opening, then entries for ever); with
    `length`, one that claims that many bytes. Everything else: the folder's files."""

    length: int | None = None
    sent = [0]
    CAP = 256 << 20  # what it sends before it gives up: only a reader that reads without bound gets this far

    def _endless(self) -> bool:
        if not self.path.endswith("/index.json"):
            return False
        self.send_response(200)
        if self.length is not None:
            self.send_header("Content-Length", str(self.length))
        self.end_headers()
        return True

    def do_HEAD(self):  # noqa: N802
        if not self._endless():
            super().do_HEAD()

    def do_GET(self):  # noqa: N802
        if not self._endless():
            return super().do_GET()
        entry = b'{"path": "s.arrow", "documents": 1, "tokens": 1, "bytes": 1, "sha256": "' + b"0" * 64 + b'"}, '
        chunk = entry * (65536 // len(entry))
        try:
            self.wfile.write(b'{"version": 1, "shards": [')
            while self.sent[0] < self.CAP:
                self.wfile.write(chunk)
                self.sent[0] += len(chunk)
        except OSError:  # the reader hung up
            pass


@pytest.mark.parametrize("length", [None, 10**12])
def test_an_endless_manifest_from_a_server_fails_fast_in_bounded_memory(tmp_path, capsys, monkeypatch, length):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    monkeypatch.setenv("DATAFLOW_MANIFEST_MAX_BYTES", "4MB")
    handler = type("EndlessHere", (Endless,), {"length": length, "sent": [0]})
    with serve(tmp_path / "www", handler=handler) as (url, asked, _):
        for command in ("verify", "inspect"):
            tracemalloc.start()
            start = time.monotonic()
            rc = main([command, f"{url}/ds"])
            took, (_, peak) = time.monotonic() - start, tracemalloc.get_traced_memory()
            tracemalloc.stop()
            err = capsys.readouterr().err
            assert rc == 1 and err.count("\n") == 1 and "more than 4,194,304 bytes" in err, err
            assert f"{url}/ds/index.json" in err and "DATAFLOW_MANIFEST_MAX_BYTES" in err
            assert took < 30 and peak < 40 << 20, (took, peak)
        with pytest.raises(FormatError, match="more than 4,194,304 bytes"):
            StreamingDataset(f"{url}/ds", seq_len=8)
    assert handler.sent[0] < handler.CAP
