"""A tokenize never imports pandas (1-2 s at start, in every process) even where it is installed: pyarrow
imports it lazily on `pa.array`/`pa.scalar`/`to_numpy`, so the tokenize path builds its arrays from buffers.

A `sitecustomize` on the child's path records every process that imports pandas; the run covers every input
kind, a real tokenizer (its load, proof and sample of the input) and two workers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.data import GPT2_JSON
from support.no_pandas import HOOK

pytest.importorskip("pandas")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inputs(folder) -> None:
    folder.mkdir()
    rows = [{"id": f"r{i}", "text": f"record {i} of the corpus"} for i in range(300)]
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "b.jsonl.gz").write_bytes(gzip.compress((folder / "a.jsonl").read_bytes()))
    # first: the coordinator samples it, and its bad record takes the slow path (pa.array of a list on fd0774e)
    (folder / "0.jsonl").write_text('{"text": "no id"}\n{"bad json\n')
    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), folder / "d.parquet", row_group_size=100)
    (folder / "e.txt").write_bytes(b"one document\nbad \xff line\n")


@pytest.fixture(scope="module")
def pandas_importers(tmp_path_factory) -> tuple[int, set[int]]:
    """(the coordinator's pid, the pids that imported pandas) of one real run."""
    tmp = tmp_path_factory.mktemp("nopandas")
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(HOOK)
    (tmp / "seen").mkdir()
    _inputs(tmp / "in")
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"text": ["from a datasets folder"] * 50}).save_to_disk(str(tmp / "in" / "f"))
    except ImportError:
        pass
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "hook"), ROOT]), "PANDAS_WATCH": str(tmp / "seen")}
    p = subprocess.Popen([sys.executable, "-m", "dataflow", "tokenize", str(tmp / "in"), "-o", str(tmp / "out"),
                          "--tokenizer", str(GPT2_JSON), "--workers", "2", "--unit-size", "64KB", "--no-progress"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    return p.pid, {int(name) for name in os.listdir(tmp / "seen")}


def test_the_coordinator_never_imports_pandas(pandas_importers):
    coordinator, importers = pandas_importers
    assert coordinator not in importers


def test_no_worker_imports_pandas(pandas_importers):
    coordinator, importers = pandas_importers
    assert not importers - {coordinator}
