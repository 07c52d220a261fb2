"""The `dataflow` command as the tests run it (a subprocess, or `main` in this process), and a dataset's bytes and
documents as they compare them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dataflow.cli import main

DATAFLOW = [sys.executable, "-m", "dataflow"]


def run(*args: object, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """`dataflow ARGS...` in a subprocess, its output captured as text."""
    return subprocess.run([*DATAFLOW, *map(str, args)], capture_output=True, text=True, check=check, **kwargs)


def dataset_bytes(out) -> dict[str, bytes]:
    """Every file of a dataset; the manifest without its timestamp."""
    files = {}
    for root, _, names in os.walk(out):
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, out)
            if n == "index.json":
                with open(path) as f:
                    d = json.load(f)
                d["provenance"].pop("created")
                files[rel] = json.dumps(d, sort_keys=True).encode()
            elif not n.startswith("_"):
                with open(path, "rb") as f:
                    files[rel] = f.read()
    return files


def tokenize(src, out, *extra) -> int:
    """`dataflow tokenize SRC... -o OUT --no-progress EXTRA...` in this process: its exit code."""
    return main(["tokenize", *map(str, src if isinstance(src, list) else [src]), "-o", str(out), "--no-progress",
                 *map(str, extra)])


def decoded(out, capsys) -> list[dict]:
    """The documents of a dataset as `dataflow decode` prints them (pytest's `capsys` catches them)."""
    capsys.readouterr()
    assert main(["decode", str(out), "--no-progress"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def same_data(out) -> dict[str, bytes]:
    """Every file of a dataset, its manifest without the input names (which differ by suffix here)."""
    files = dataset_bytes(out)
    manifest = json.loads(files["index.json"])
    manifest["provenance"].pop("inputs")
    manifest["provenance"].pop("input_files")
    manifest["provenance"]["settings"].pop("inputs")
    files["index.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def tokenize_small(src, out, *extra, check=True) -> subprocess.CompletedProcess:
    """`dataflow tokenize` in small shards and units (512 KB, 256 KB): several of each from a corpus of a few MB."""
    p = subprocess.run([*DATAFLOW, "tokenize", str(src), "-o", str(out), "--shard-size", "512KB",
                        "--unit-size", "256KB", *map(str, extra)], capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(p.stderr)
    return p
