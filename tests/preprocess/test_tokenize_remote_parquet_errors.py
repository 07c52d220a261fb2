"""Remote inputs whose server fails, through a local HTTP server that misbehaves (tests/support/http_files.py).

A 503 while the inputs are listed and a footer read cut short are retried like a row group's read (and a run
that gets its answers in the end gives the tokens of the local file); a server that keeps failing, at any
step, is one line, exit 1. A server that answers protocol garbage is one line too, quoting at most a few
hundred characters of what it sent."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataflow.cli import main
from dataflow.formats import remote
from dataflow.sources import parquet
from support.http_files import _Files, serve
from support.cli import decoded

ROWS = 3000


@pytest.fixture
def www(tmp_path, monkeypatch):
    """A Parquet file of three row groups (and the same records as JSONL) to serve; retries do not wait."""
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    parquet._plans.clear()  # plans of this process's earlier tests (same URLs, other files)
    root = tmp_path / "www"
    root.mkdir()
    rows = [{"id": f"doc-{i}", "text": f"document {i} " * (i % 7 + 1)} for i in range(ROWS)]
    pq.write_table(pa.Table.from_pylist(rows), root / "a.parquet", row_group_size=ROWS // 3)
    with open(root / "a.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return root


class Misbehaving(_Files):
    """Serves the folder's files, ranges too (pyarrow reads a footer and column chunks by range), and answers
    the requests `failing(self)` picks with `answer`: an HTTP status, "cut" (half of the bytes it announced,
    then the connection closed) or "garbage" (bytes that are not HTTP). `times` (a one-item list) counts the
    failures down; None: fail for ever."""

    times: list = [None]  # a subclass's own list (`server`)
    answer: int | str = 503

    def failing(self) -> bool:
        return True

    def ranged(self) -> tuple[int, int] | None:
        """The (first, last) byte a GET asks for; None for the whole file."""
        spec = self.headers.get("Range", "").removeprefix("bytes=")
        if self.command != "GET" or not spec:
            return None
        size = os.path.getsize(os.path.join(self.server.root, self.path.lstrip("/")))
        first, _, last = spec.partition("-")
        if not first:
            return max(size - int(last), 0), size - 1
        return int(first), min(int(last), size - 1) if last else size - 1

    def end_of_file(self) -> bool:
        """A read that ends where the file ends (its footer, and any read of the whole file)."""
        asked = self.ranged()
        size = os.path.getsize(os.path.join(self.server.root, self.path.lstrip("/")))
        return asked is None or asked[1] == size - 1

    def _file(self):
        self.server.asked.append(self.path)
        full = os.path.join(self.server.root, self.path.lstrip("/"))
        if not os.path.isfile(full):
            self.send_error(404)
            return None
        fail = self.failing() and self.times[0] != 0
        if fail and self.times[0] is not None:
            self.times[0] -= 1
        if fail and self.answer == "garbage":
            self.close_connection = True
            self.wfile.write(b"\x00\x01garbage from the server " * 4000)
            return None
        if fail and self.answer != "cut":
            self.send_error(self.answer)
            return None
        with open(full, "rb") as f:
            body = f.read()
        asked = self.ranged()
        self.send_response(200 if asked is None else 206)
        if asked is not None:
            self.send_header("Content-Range", f"bytes {asked[0]}-{asked[1]}/{len(body)}")
            body = body[asked[0]:asked[1] + 1]
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if fail:  # "cut": half of what was announced
            self.close_connection = True
            self.wfile.write(body[:len(body) // 2])
            return None
        return body


def server(answer, times=None, when=lambda h: True) -> type:
    return type("Here", (Misbehaving,), {"answer": answer, "times": [times], "failing": when})


def tokenize(src, out, *extra) -> int:
    return main(["tokenize", str(src), "-o", str(out), "--no-progress", "--workers", "1", *map(str, extra)])


def one_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert len(err) < 2000, f"{len(err)} characters"
    for needle in needles:
        assert needle in err, err
    return err


def first_request(h) -> bool:
    return True


def footer_read(h) -> bool:
    return h.ranged() is not None and h.end_of_file()


def row_group_read(h) -> bool:
    return h.ranged() is not None and not h.end_of_file()


@pytest.mark.parametrize("answer, when", [(503, first_request), ("cut", footer_read), (503, footer_read),
                                          ("cut", row_group_read)])
def test_a_failure_that_passes_is_retried_and_the_tokens_are_whole(www, tmp_path, capsys, answer, when):
    assert tokenize(www / "a.parquet", tmp_path / "here") == 0
    with serve(www, handler=server(answer, times=2, when=when)) as (url, _, _):
        assert tokenize(f"{url}/a.parquet", tmp_path / "remote") == 0
    assert decoded(tmp_path / "remote", capsys) == decoded(tmp_path / "here", capsys)


@pytest.mark.parametrize("answer, when, said", [(503, first_request, "503"), ("cut", footer_read, "not completed"),
                                                (503, row_group_read, "503")])
def test_a_server_that_keeps_failing_is_one_line(www, tmp_path, capsys, answer, when, said):
    with serve(www, handler=server(answer, when=when)) as (url, _, _):
        capsys.readouterr()
        assert tokenize(f"{url}/a.parquet", tmp_path / "remote") == 1
        one_line(capsys, f"{url}/a.parquet", said)


@pytest.mark.parametrize("name, when", [("a.parquet", footer_read), ("a.parquet", row_group_read),
                                        ("a.jsonl", first_request)])
def test_protocol_garbage_is_one_short_line(www, tmp_path, capsys, name, when):
    with serve(www, handler=server("garbage", when=when)) as (url, _, _):
        capsys.readouterr()
        assert tokenize(f"{url}/{name}", tmp_path / "remote") == 1
        err = one_line(capsys, f"{url}/{name}")
        assert err.count("garbage") * len("garbage from the server ") <= 400, err
