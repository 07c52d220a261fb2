"""The shipped test data (tests/data/: KJV corpus, GPT-2 tokenizer; licenses in tests/data/LICENSES.md) and small
datasets made on the spot."""

from __future__ import annotations

import json
import os

from tools import repo_data

KJV = repo_data.KJV
GPT2_JSON = repo_data.gpt2_json()
GPT2_TIKTOKEN = repo_data.gpt2_tiktoken()


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


# words for made-up documents: unicode, digits, a special token's text, whitespace runs, a line break, an emoji
WORDS = ["alpha", "beta", "γάμμα", "delta 42", "<|endoftext|>", "  spaces  ", "line\nbreak", "emoji 🙂", ""]


def texts(n: int) -> list[str]:
    """`n` made-up documents of 0 to 12 of WORDS (some empty)."""
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(i % 13)) for i in range(n)]


def token_ids(out) -> list[tuple[str, list[int]]]:
    """(id, token ids) of every document of a dataset, in stored order."""
    from dataflow.formats.manifest import read_manifest
    from dataflow.formats.reader import iter_documents

    dataset = str(out)
    return [(doc_id, tokens.tolist()) for doc_id, tokens in iter_documents(dataset, read_manifest(dataset))]


def edit_manifest(path: str, change) -> None:
    """Apply `change` to the dataset's index.json as a dict, in place (a hand-edited manifest)."""
    index = os.path.join(path, "index.json")
    with open(index) as f:
        d = json.load(f)
    change(d)
    with open(index, "w") as f:
        json.dump(d, f)
