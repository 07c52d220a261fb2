"""`dataflow tokenize hf://datasets/ORG/NAME/...parquet` through a local stand-in of the Hub (tests/support/hf_stub.py).

What a node asks of the Hub is bounded: one footer read per file by the coordinator and per file per worker
(not one per row group), at most one request per needed column chunk of a row group (never read-ahead of the
columns not asked for), a 429 retried; and the tokens are exactly those of the same files read locally."""

from __future__ import annotations

import os
import shutil
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.cli import main
from dataflow.formats import remote
from dataflow.sources import parquet
from support import hf_stub
from support.data import texts, token_ids

GROUPS, ROWS = 8, 150  # row groups per file, rows per row group
JUNK = 1000  # bytes of an incompressible column per row that no one asks for


def write(path, seed: int, ids: bool = True) -> None:
    """A Parquet file laid out as the worst case for ranged reads: the text and id columns far apart, with a
    large column between them; row groups of about 150 KB (each its own unit with --unit-size 64KB)."""
    rng = np.random.default_rng(seed)
    n = GROUPS * ROWS
    junk = [rng.bytes(JUNK) for _ in range(n)]
    columns = {"text": texts(n + seed)[seed:], "junk": junk}
    if ids:
        columns["id"] = [f"doc-{seed}-{i}" for i in range(n)]
    columns["n"] = list(range(n))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=ROWS)


@pytest.fixture
def hub(tmp_path):
    """A Hub folder with dataset org/corpus (data/part-0.parquet, data/part-1.parquet), a copy of it on
    local disk, and the request log; the stub is served while the test runs."""
    root, log = tmp_path / "hub", str(tmp_path / "requests.log")
    data = root / "datasets" / "org" / "corpus" / "data"
    for k in range(2):
        write(str(data / f"part-{k}.parquet"), seed=k)
    shutil.copytree(data, tmp_path / "local")
    hf_stub.install(str(root), log)
    getattr(parquet, "_plans", {}).clear()  # plans of this process's earlier tests (same URLs, other files)
    yield tmp_path
    hf_stub.uninstall()


def tokenize(src, out, *extra) -> int:
    return main(["tokenize", *map(str, src if isinstance(src, list) else [src]), "-o", str(out), "--no-progress",
                 "--tokenizer", "bytes", *map(str, extra)])


def column_ranges(path: str, names: tuple[str, ...]) -> list[tuple[int, int]]:
    """The byte range of each column chunk of `names` in every row group of a local Parquet file."""
    meta = pq.ParquetFile(path).metadata
    out = []
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            chunk = meta.row_group(g).column(c)
            if chunk.path_in_schema in names:
                start = chunk.dictionary_page_offset or chunk.data_page_offset
                out.append((start, start + chunk.total_compressed_size))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_hub_parquet_is_read_with_one_footer_per_file_and_process_and_gives_the_local_tokens(hub, workers):
    url = "hf://datasets/org/corpus/data/*.parquet"
    assert tokenize(url, hub / "remote", "--workers", workers, "--unit-size", "64KB") == 0
    assert tokenize(hub / "local" / "*.parquet", hub / "here", "--workers", workers, "--unit-size", "64KB") == 0
    got = token_ids(hub / "remote")
    assert got == token_ids(hub / "here") and len(got) == 2 * GROUPS * ROWS

    log = hf_stub.requests(str(hub / "requests.log"))
    sizes = {f"datasets/org/corpus/data/part-{k}.parquet": os.path.getsize(hub / "local" / f"part-{k}.parquet")
             for k in range(2)}
    footers = [r for r in log if r.end == sizes[r.path]]
    coordinator = os.getpid()
    for path in sizes:
        assert sum(r.pid == coordinator for r in footers if r.path == path) == 1, "planning reads a footer once"
    workers_footers = [(r.pid, r.path) for r in footers if r.pid != coordinator]
    assert len(workers_footers) == len(set(workers_footers)), "a worker reads a file's footer once"

    # every other request lies within the text and id column chunks it needs: no read-ahead of `junk`
    for path, size in sizes.items():
        local = str(hub / "local" / path.rsplit("/", 1)[-1])
        wanted = column_ranges(local, ("text", "id"))
        body = [r for r in log if r.path == path and r.end != size]
        assert all(any(a <= r.start and r.end <= b for a, b in wanted) for r in body), "bytes outside text/id"
        assert len(body) <= len(wanted), "at most one request per needed column chunk"
        fetched = sum(r.end - r.start for r in log if r.path == path)
        assert fetched < size / 2  # the junk column, most of the file, is never fetched


def test_adjacent_text_and_id_chunks_of_a_row_group_are_one_request(hub):
    data = hub / "hub" / "datasets" / "org" / "corpus" / "data"
    for k in range(2):
        table = pq.read_table(data / f"part-{k}.parquet").select(["text", "id", "junk", "n"])
        pq.write_table(table, data / f"part-{k}.parquet", row_group_size=ROWS)
    assert tokenize("hf://datasets/org/corpus/data", hub / "out", "--workers", 1, "--unit-size", "64KB") == 0
    sizes = {p: os.path.getsize(data / p.rsplit("/", 1)[-1]) for p in
             (f"datasets/org/corpus/data/part-{k}.parquet" for k in range(2))}
    body = [r for r in hf_stub.requests(str(hub / "requests.log")) if r.end != sizes[r.path]]
    assert len(body) == 2 * GROUPS  # pre_buffer coalesces the two chunks of a row group into one read


def test_a_hub_url_without_ids_derives_the_same_ids_as_the_local_file(hub):
    data = hub / "hub" / "datasets" / "org" / "corpus" / "data"
    write(str(data / "part-0.parquet"), seed=0, ids=False)
    os.remove(data / "part-1.parquet")
    write(str(hub / "plain" / "part-0.parquet"), seed=0, ids=False)
    assert tokenize("hf://datasets/org/corpus/data/part-0.parquet", hub / "remote", "--workers", 2) == 0
    assert tokenize(hub / "plain" / "part-0.parquet", hub / "here", "--workers", 2) == 0
    got = token_ids(hub / "remote")
    assert got == token_ids(hub / "here") and got[ROWS + 1][0] == f"part-0.parquet:{ROWS + 1}"


@pytest.mark.parametrize("fail", [1, 3])
def test_a_429_from_the_hub_is_retried_and_the_tokens_are_whole(hub, monkeypatch, fail):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    hf_stub.HubStub.fail = fail  # the first requests of the worker are answered 429
    url = "hf://datasets/org/corpus/data/part-0.parquet"
    assert tokenize(url, hub / "remote", "--workers", 1, "--unit-size", "64KB") == 0
    assert tokenize(hub / "local" / "part-0.parquet", hub / "here", "--workers", 1, "--unit-size", "64KB") == 0
    assert token_ids(hub / "remote") == token_ids(hub / "here")


def test_footers_of_many_files_are_read_at_once_and_then_planning_asks_nothing(hub):
    data = hub / "hub" / "datasets" / "org" / "corpus" / "data"
    files = [f"hf://datasets/org/corpus/data/part-{k}.parquet" for k in range(2)]
    sizes = [os.path.getsize(data / f"part-{k}.parquet") for k in range(2)]
    both = threading.Barrier(2, timeout=30)  # each footer read waits for the other one: read serially, they fail
    fetch = hf_stub.StubFile._fetch_range

    def together(self, start, end):
        if end == self.size:
            both.wait()
        return fetch(self, start, end)

    hf_stub.StubFile._fetch_range = together
    try:
        parquet.read_plans(files, sizes)
    finally:
        hf_stub.StubFile._fetch_range = fetch
    assert not both.broken, "the two footers were not read at the same time"
    os.remove(hub / "requests.log")
    assert [len(parquet.spans(f, s)) for f, s in zip(files, sizes)] == [GROUPS, GROUPS]
    assert parquet.first_fields(files[0]) == ["text", "junk", "id", "n"]
    assert hf_stub.requests(str(hub / "requests.log")) == []


def test_a_local_parquet_file_changed_between_runs_is_planned_again(tmp_path):
    path = str(tmp_path / "a.parquet")
    write(path, seed=0)
    assert len(parquet.spans(path, os.path.getsize(path))) == GROUPS
    pq.write_table(pq.read_table(path), path, row_group_size=ROWS * 2)
    os.utime(path, ns=(1, 1))  # another mtime for certain, even within the clock's resolution
    assert len(parquet.spans(path, os.path.getsize(path))) == GROUPS // 2


def test_hf_without_huggingface_hub_is_one_line_saying_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub fails
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "hf", raising=False)
    code = main(["tokenize", "hf://datasets/org/corpus/data/*.parquet", "-o", str(tmp_path / "out"),
                 "--tokenizer", "bytes", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "pip install huggingface_hub" in err and "hf://datasets/org/corpus/data/*.parquet" in err


def test_an_unreachable_hub_is_one_line_whatever_the_client_raises(tmp_path, monkeypatch, capsys):
    """huggingface_hub talks to the Hub through httpx, whose errors are not OSErrors: no network is still one
    line naming the URL and what to check, not a traceback."""
    from dataflow.sources import listing

    class ConnectError(Exception):  # httpx's name for a refused or unresolvable host
        pass

    def unreachable(url, *args, **kwargs):
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(listing.fsspec, "get_fs_token_paths", unreachable)
    code = main(["tokenize", "hf://datasets/org/corpus/data/*.parquet", "-o", str(tmp_path / "out"),
                 "--tokenizer", "bytes", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "hf://datasets/org/corpus/data/*.parquet" in err and "cannot reach" in err



@pytest.mark.parametrize("url", ["hf://datasets/org/secret/data/*.parquet", "hf://datasets/org/secret",
                                 "hf://datasets/org/corpus/data/*.jsonl"])
def test_a_hub_dataset_not_found_is_one_line_that_names_hf_token(hub, capsys, url):
    """The Hub answers "not found" for a private or gated dataset without a token that can read it."""
    code = main(["tokenize", url, "-o", str(hub / "out"), "--tokenizer", "bytes", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and url in err and "set HF_TOKEN" in err
