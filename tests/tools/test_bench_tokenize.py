"""tools/bench_tokenize.py families, in its quick mode: it runs the whole command, the raw engine and raw `tokenizers`
on the same documents and prints the ratio table and the CPU accounting, so the benchmark cannot silently break."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_families_quick_prints_the_ratio_table(tmp_path):
    out = tmp_path / "result.json"
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_tokenize.py"), "families", "--quick",
                        "--families", "gpt2", "--corpora", "kjv", "--work", str(tmp_path / "work"),
                        "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert any(x.split()[:1] == ["family"] and "ours/raw cpu" in x and "ours/tok cpu" in x for x in lines)
    rows = [x.split() for x in lines if x.split()[:1] == ["gpt2"] and "|" in x]
    assert [r[2] for r in rows] == ["1", "2"]  # one row per worker count, engine named
    assert all(r[1] == "gigatoken" for r in rows)
    assert any("coord CPU-s/GB" in x for x in lines)
    assert any("ours/raw gigatoken >= 0.5" in x and "ours/raw tokenizers >= 10" in x for x in lines)
    result = json.loads(out.read_text())
    assert [r["workers"] for r in result["rows"]] == [1, 2]
    # the same documents: ours has exactly one token (GPT-2's EOS) a document more than either raw engine
    for row in result["rows"]:
        assert row["ours"]["tokens"] - row["raw"]["tokens"] == row["ours"]["docs"]
        assert row["raw"]["tokens"] == row["raw_tokenizers"]["tokens"]
        assert 0 < row["ours"]["coordinator_cpu_s"] < row["ours"]["cpu_s"]


def test_unknown_family_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_tokenize.py"), "families", "--quick",
                        "--families", "gpt5", "--work", str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert p.returncode == 2 and "unknown family or corpus: gpt5" in p.stderr
