import os
import pathlib
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository: tools/
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tests/: support/

# Tests prove tokenizer equivalence themselves: never reuse a proof remembered by an earlier run.
os.environ["DATAFLOW_PROOF_CACHE"] = tempfile.mkdtemp(prefix="dataflow-proofs-")
# Shard and decoded-shard caches of this run: never the user's ~/.cache/dataflow, never an earlier run's.
os.environ.setdefault("DATAFLOW_CACHE", tempfile.mkdtemp(prefix="dataflow-cache-"))
# tokenize saves its journal after every unit (not once a second): the kill -9 tests resume from many points
os.environ.setdefault("DATAFLOW_JOURNAL_SECONDS", "0")

from support.data import KJV  # noqa: E402  (the shipped test data: tests/support/data.py)


def pytest_collection_modifyitems(config, items):
    """A test marked `timing` measures real parallel work on a shared machine: it may run three times."""
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.flaky(reruns=2))


@pytest.fixture(scope="session")
def kjv() -> pathlib.Path:
    if not KJV.exists():
        pytest.fail(f"real test data missing: {KJV}")
    return KJV


@pytest.fixture(scope="session")
def kjv10(kjv, tmp_path_factory) -> pathlib.Path:
    """KJV ten times as plain JSONL (44 MB of text, ids made distinct): more than one default unit (32 MB), and
    with the bytes tokenizer several 2M-token record batches per shard."""
    import zstandard

    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    path = tmp_path_factory.mktemp("kjv10") / "kjv10.jsonl"
    with open(path, "wb") as f:
        for copy in range(10):
            for line in lines:
                f.write(line.replace(b'"id": "', f'"id": "{copy}-'.encode(), 1))
    return path
