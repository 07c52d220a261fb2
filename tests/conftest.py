import os
import pathlib
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tools import repo_data  # noqa: E402

# Tests prove tokenizer equivalence themselves: never reuse a proof remembered by an earlier run.
os.environ["DATAFLOW_PROOF_CACHE"] = tempfile.mkdtemp(prefix="dataflow-proofs-")
# Shard and decoded-shard caches of this run: never the user's ~/.cache/dataflow, never an earlier run's.
os.environ.setdefault("DATAFLOW_CACHE", tempfile.mkdtemp(prefix="dataflow-cache-"))
# tokenize saves its journal after every unit (not once a second): the kill -9 tests resume from many points
os.environ.setdefault("DATAFLOW_JOURNAL_SECONDS", "0")

# The real test data ships in tests/data/ (licenses in tests/data/LICENSES.md); nothing outside the repository.
KJV = repo_data.KJV
GPT2_JSON = repo_data.gpt2_json()
GPT2_TIKTOKEN = repo_data.gpt2_tiktoken()


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


def write_counting_dataset(out, tokens: int, docs: int, shard_size: str) -> str:
    """A dataset whose tokens count 0, 1, 2, ... (mod 65,000) across `docs` documents: every window is
    identifiable, so order and values can be checked exactly."""
    import numpy as np

    from dataflow import ShardWriter, TokenizerMeta

    meta = TokenizerMeta(kind="hf", name="counting", vocab_size=65536, eos_id=65535)
    with ShardWriter(str(out), tokenizer_meta=meta, shard_size=shard_size) as w:
        for doc in np.array_split(np.arange(tokens) % 65_000, docs):
            w.write(doc)
    return str(out)


def write_random_dataset(out, docs: int, seed: int, min_len: int, max_len: int = 2000) -> str:
    """Byte-vocabulary documents of random tokens and lengths in [min_len, max_len), ids d0, d1, ...;
    64 KB shards."""
    import numpy as np

    from dataflow import ShardWriter, TokenizerMeta

    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    rng = np.random.default_rng(seed)
    with ShardWriter(str(out), tokenizer_meta=meta, shard_size="64KB") as w:
        for i in range(docs):
            w.write(rng.integers(0, 256, size=int(rng.integers(min_len, max_len))).astype(np.uint16), id=f"d{i}")
    return str(out)
