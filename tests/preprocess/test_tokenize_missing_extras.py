"""An object-store URL whose fsspec backend is not installed is one line naming the extra to install, for the
output, the tokenizer and the inputs alike (it was 40-60 lines of traceback)."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.cli import DATAFLOW

EXTRA = {"gs": "dataflow-lm[gcs]", "az": "dataflow-lm[azure]", "s3": "dataflow-lm[s3]"}


@pytest.fixture
def without_s3fs(tmp_path):
    """A PYTHONPATH on which `import s3fs` fails as it does where the extra is not installed."""
    (tmp_path / "blocked" / "s3fs").mkdir(parents=True)
    (tmp_path / "blocked" / "s3fs" / "__init__.py").write_text("raise ImportError('No module named s3fs')\n")
    return str(tmp_path / "blocked")


@pytest.mark.parametrize("where", ["-o", "--tokenizer", "input"])
@pytest.mark.parametrize("scheme", ["gs", "az", "s3"])
def test_a_url_whose_backend_is_missing_is_one_line_naming_the_extra(tmp_path, kjv, without_s3fs, where, scheme):
    url = f"{scheme}://bucket/{'tok.json' if where == '--tokenizer' else 'x'}"
    args = {"-o": [kjv, "-o", url], "--tokenizer": [kjv, "-o", tmp_path / "out", "--tokenizer", url],
            "input": [url + ".jsonl", "-o", tmp_path / "out"]}[where]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([without_s3fs, os.getcwd()]))
    p = subprocess.run([*DATAFLOW, "tokenize", *map(str, args), "--no-progress"], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and EXTRA[scheme] in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
