"""Shared by the `dataflow convert` tests: real tokenizer ids (KJV through GPT-2), made once per session."""

from __future__ import annotations

import functools
import tempfile

import numpy as np

from dataflow.cli import main
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents
from tools import repo_data


@functools.lru_cache(maxsize=None)
def kjv_gpt2(eos: bool = True) -> str:
    """The KJV corpus (1,189 chapters) tokenized with GPT-2's tokenizer.json, EOS after each unless not `eos`."""
    out = tempfile.mkdtemp(prefix="dataflow-convert-") + "/kjv-gpt2"
    args = ["tokenize", str(repo_data.KJV), "-o", out, "--tokenizer", str(repo_data.gpt2_json()), "--workers", "1",
            "--shard-size", "512KB", "--no-progress"]
    assert main(args + ([] if eos else ["--no-eos"])) == 0
    return out


def documents(dataset: str) -> list[tuple[str, np.ndarray]]:
    """(id, tokens) of every document, in stored order, through the public reader."""
    return list(iter_documents(dataset, read_manifest(dataset)))


def convert(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `dataflow convert ARGV` as the command line does: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["convert", *argv, "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str, code: int, expected: int, *words: str) -> None:
    """The command failed with `expected` and said why in one line naming `words` (no traceback)."""
    assert code == expected, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dataflow convert: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
