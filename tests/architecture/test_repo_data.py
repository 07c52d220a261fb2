"""The real test data ships in the repository: nothing the tests or tools run reads outside it."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import zstandard

from support.data import GPT2_JSON, GPT2_TIKTOKEN, KJV
from tools import repo_data

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_kjv_is_in_the_repository_and_whole():
    assert KJV.resolve().is_relative_to(ROOT / "tests" / "data")
    lines = zstandard.ZstdDecompressor().stream_reader(KJV.open("rb")).read().splitlines()
    assert len(lines) == 1189
    assert set(json.loads(lines[0])) >= {"id", "text"}


def test_gpt2_files_unpack_into_a_fresh_folder_with_the_right_content(tmp_path):
    out = repo_data.gpt2_dir(tmp_path)
    assert out.is_relative_to(tmp_path)
    for name, digest in repo_data._SHA256.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]["<|endoftext|>"] == 50256
    (out / "gpt2.tiktoken").write_bytes(b"damaged")  # a damaged copy is replaced, not handed out
    repo_data.gpt2_dir(tmp_path)
    assert hashlib.sha256((out / "gpt2.tiktoken").read_bytes()).hexdigest() == repo_data._SHA256["gpt2.tiktoken"]
    assert GPT2_JSON.name == "tokenizer.json" and GPT2_TIKTOKEN.name == "gpt2.tiktoken"


def test_no_source_refers_to_a_shared_folder_beside_the_checkout():
    sources = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"bench-out", "demo-out", "__pycache__"}]
        sources += [pathlib.Path(folder, f) for f in files if f.endswith((".py", ".mk", ".toml")) or f == "Makefile"]
    assert len(sources) > 50
    needles = ('"shared", "data"', "shared/data", '"shared" / "data"', "DATAFLOW_SHARED_DATA")
    offenders = [str(p.relative_to(ROOT)) for p in sources if p != pathlib.Path(__file__)
                 and any(n in p.read_text(errors="replace") for n in needles)]
    assert offenders == []


def test_the_data_resolves_from_a_copy_of_the_tests_with_nothing_beside_it(tmp_path):
    """The tests' data module (support/data.py) and repo_data run from a copy of the repository whose parent holds
    nothing else."""
    copy = tmp_path / "clone"
    (copy / "tests" / "data").mkdir(parents=True)
    (copy / "tools").mkdir()
    (copy / "tests" / "support").mkdir()
    for rel in ("tests/conftest.py", "tests/support/__init__.py", "tests/support/data.py", "tools/repo_data.py"):
        (copy / rel).write_bytes((ROOT / rel).read_bytes())
    shutil.copytree(repo_data.DATA, copy / "tests" / "data", dirs_exist_ok=True)
    code = ("import sys; sys.path.insert(0, 'tests'); import conftest; from support import data; "
            "print(conftest.KJV.exists(), data.GPT2_JSON.exists(), data.GPT2_TIKTOKEN.exists(), "
            "data.KJV.resolve().is_relative_to(__import__('pathlib').Path.cwd()))")
    r = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"] * 4
