"""tools/peers/report.py: the sections other benchmarks feed (tokenizer families, object storage) are rewritten from
their results when a run left them, and kept as they are when it did not: a run of one benchmark never erases
another's table."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = """# Benchmarks

Intro.

## Tokenize

the tokenize table

## Tokenize: every tokenizer family

an old families table

## Streaming from object storage

the remote table

### Against the peers

a sub-table

## Where our time goes (profiles)

profiles
"""


def families_results(path: Path) -> None:
    rate = {"wall_s": 1.0, "cpu_s": 1.0, "tokens": 100, "mb_s": 10.0, "mb_cpu_s": 10.0}
    row = {"family": "gpt2", "corpus": "kjv", "workers": 1, "text_mb": 10.0, "engine": "gigatoken",
           "ours": dict(rate, tokens=110, docs=10, text_bytes=10_000_000, coordinator_cpu_s=0.5, workers_cpu_s=0.5,
                        mb_s=5.0, mb_cpu_s=5.0),
           "raw": rate, "raw_tokenizers": dict(rate, mb_s=0.5, mb_cpu_s=0.5)}
    path.write_text(json.dumps({"machine": {}, "mb": 10.0, "quick": False, "rows": [row],
                                "command": "python tools/bench_tokenize.py families --mb 10"}))


def report(tmp_path: Path, *extra: str) -> str:
    gone = str(tmp_path / "absent.json")
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "peers" / "report.py"), "--md", str(tmp_path / "b.md"),
                        "--loader", gone, "--tokenize", gone, "--coordinator", gone, *extra],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return (tmp_path / "b.md").read_text()


def test_a_families_run_replaces_its_section_and_keeps_the_rest(tmp_path):
    (tmp_path / "b.md").write_text(PAGE)
    families_results(tmp_path / "fam.json")
    page = report(tmp_path, "--families", str(tmp_path / "fam.json"), "--remote", str(tmp_path / "absent.md"))
    assert "an old families table" not in page
    assert "| kjv | gpt2 | gigatoken | 1 | 5.0 | 0.50 | 0.50 |" in page
    for kept in ("the tokenize table", "the remote table", "a sub-table", "profiles"):
        assert kept in page
    assert page.index("## Tokenize: every tokenizer family") < page.index("## Streaming from object storage")


def test_a_remote_markdown_replaces_its_section_and_missing_results_keep_theirs(tmp_path):
    (tmp_path / "b.md").write_text(PAGE)
    (tmp_path / "remote.md").write_text("| link | loader |\n|---|---|\n| 20 ms | dataflow |\n")
    page = report(tmp_path, "--families", str(tmp_path / "absent.json"), "--remote", str(tmp_path / "remote.md"))
    assert "the remote table" not in page and "a sub-table" not in page and "| 20 ms | dataflow |" in page
    assert "an old families table" in page and page.rstrip().endswith("profiles")
