"""The tests mirror the packages (issue 35, step 8): a test file sits in the folder of the package it tests, or in
one of the folders for what spans packages; the names stay unique (pytest imports each test file by its name)."""

import collections

from support.paths import ROOT, TESTS

PACKAGES = {"audit", "convert", "formats", "loading", "preprocess", "profiling", "sources", "tokenizers"}  # dataflow/
SPANNING = {"architecture": "the guards of the layout itself", "cli": "the command line and its errors",
            "tools": "the benchmarks in tools/", "trainer": "the bundled trainer (trainer/)"}
NOT_TESTS = {"data", "old_states", "support", "__pycache__"}
KEPT_AT_THE_TOP = {"test_cuda.py"}  # the device check's path, named where a GPU is lent: `pytest tests/test_cuda.py`


def test_every_test_file_sits_in_its_package_folder():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir()} - NOT_TESTS
    assert folders == PACKAGES | set(SPANNING)
    assert all((ROOT / "dataflow" / name / "__init__.py").exists() for name in PACKAGES)
    assert {p.name for p in TESTS.glob("test_*.py")} == KEPT_AT_THE_TOP
    for folder in folders:
        assert list((TESTS / folder).glob("test_*.py")), f"tests/{folder}/ holds no test"
        assert not (TESTS / folder / "conftest.py").exists(), "fixtures live in tests/support/, one conftest"


def test_test_file_names_are_unique():
    names = collections.Counter(p.name for p in TESTS.rglob("test_*.py") if not NOT_TESTS & set(p.parts))
    assert [n for n, c in names.items() if c > 1] == []
