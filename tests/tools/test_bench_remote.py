"""tools/bench_remote.py, the streaming-from-S3 benchmark: its quickest form runs end to end (moto, the throttling
proxy, a case in a fresh process) and checks what the loader served; the check itself tells a loader that
served the dataset's windows from one that served some twice or none; with the peers' environment
(.bench-venv, `make bench-setup`), every peer reads its own format from the same bucket."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "tools" / "bench_remote.py"
PEER_PY = ROOT / ".bench-venv" / "bin" / "python"
sys.path.insert(0, str(ROOT))

from tools.peers.remote_samples import W, hash_rows, resume_verdict, verdict  # noqa: E402


def _run(tmp_path, *args: str, timeout: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "result.json"
    p = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out), *args], capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return p, json.loads(out.read_text())


def test_the_sample_check_tells_the_dataset_from_a_duplicate_or_nothing():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 50257, size=(40, W), dtype=np.uint16)
    expected = np.sort(hash_rows(data))
    served = hash_rows(data[rng.permutation(40)])
    assert verdict(served, expected, slack=8) == "ok"
    assert verdict(served[:35], expected, slack=8) == "ok"  # a partial last batch dropped
    assert verdict(np.concatenate([served[:36], served[:4]]), expected, slack=8) == "BAD(+4 -4)"
    assert verdict(served[:0], expected, slack=8) == "BAD(+0 -40)"
    other = data.copy()
    other[0, 7] += 1  # one token off
    assert verdict(hash_rows(other), expected, slack=8) == "BAD(+1 -1)"
    assert resume_verdict(served[:20], served[20:], served) == "exact"
    assert resume_verdict(served[:20], served[16:], served) == "+4 -0"


@pytest.mark.heavy
def test_quick_run_dataflow_alone(tmp_path):
    md = tmp_path / "table.md"
    p, rows = _run(tmp_path, "--peers", "none", "--markdown", str(md), timeout=240)
    lines = p.stdout.splitlines()
    table = md.read_text().splitlines()
    assert table[0].startswith("`python tools/bench_remote.py --quick") and table[2].startswith("| link | loader")
    assert table[4].startswith("| 20 ms / 100 MB/s | dataflow | 0 | ") and table[4].endswith("| ok | exact |")
    assert any(x.split()[:2] == ["code", "workers"] and "samples" in x for x in lines)
    assert [(r["code"], r["workers"], r["mbps"]) for r in rows] == [("dataflow", 0, 100.0)]
    r = rows[0]
    assert r["samples"] == "ok" and r["resume"] == "exact", r
    assert 0.99 < r["fetched_x"] < 1.2 and r["gets"] > 0 and r["peak_rss"] > 0 and r["cache_peak"] > 0
    assert 0 < r["share"] < 1 and r["first_s"] <= r["epoch_s"]


@pytest.mark.heavy
@pytest.mark.skipif(not PEER_PY.exists(), reason="the peers' environment (.bench-venv: make bench-setup) is absent")
def test_quick_run_with_the_peers(tmp_path):
    p, rows = _run(tmp_path, timeout=600)
    by = {r["code"]: r for r in rows}
    assert sorted(by) == ["dataflow", "litdata", "mosaic", "webdataset"], p.stdout[-3000:]
    for code, r in by.items():
        assert "error" not in r, (code, r)
        assert r["samples"] == "ok", (code, r)
        assert r["fetched_x"] > 0.9 and r["gets"] > 0, (code, r)
    assert by["mosaic"]["resume"] == by["litdata"]["resume"] == by["dataflow"]["resume"] == "exact"
    assert by["webdataset"]["resume"] == "n/a" and by["webdataset"]["first_resumed_s"] is None
    assert any(x.startswith("  ratio to the best, 0 workers:") for x in p.stdout.splitlines())
