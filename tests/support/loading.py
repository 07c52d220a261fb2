"""Small KJV datasets of byte tokens for the loader, audit and profiler tests (pytest fixtures)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zstandard

from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from support.data import KJV

SEQ, BATCH = 64, 4  # the audit tests' samples and batches
BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


def kjv_lines_dataset(out, size: int, shard_size: str) -> str:
    """The KJV's JSONL lines (the first `size` bytes, whole lines) as byte-token documents in zstd shards of
    `shard_size`: the remote loading tests' datasets."""
    with open(KJV, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read(size).splitlines()[:-1]
    with ShardWriter(str(out), tokenizer_meta=BYTES, shard_size=shard_size, compression="zstd") as w:
        for i, line in enumerate(lines):
            w.write(np.frombuffer(line, np.uint8).astype(np.uint16), id=f"kjv{i}")
    return str(out)


@pytest.fixture(scope="module")
def kjv_data(tmp_path_factory):
    """The first 100 documents of the KJV as byte tokens: about 2,200 samples of 65 tokens."""
    with open(KJV, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()[:100]
    out = tmp_path_factory.mktemp("kjv") / "data"
    meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
    with ShardWriter(str(out), tokenizer_meta=meta, shard_size="32KB") as w:
        for line in lines:
            record = json.loads(line)
            w.write(np.frombuffer(record["text"].encode(), np.uint8).astype(np.uint16), id=record["id"])
    return str(out)


@pytest.fixture()
def small_shards(tmp_path, kjv_data):  # noqa: F811
    """The KJV documents again, in uncompressed 8 KB shards (a new shard every few batches, no decode stage)."""
    from dataflow import ShardWriter

    ds = StreamingDataset(kjv_data)
    out = tmp_path / "small"
    with ShardWriter(str(out), tokenizer_meta=ds.tokenizer, shard_size="8KB", compression="none") as w:
        for i in range(ds.num_samples):
            w.write(ds[i]["tokens"].numpy().astype("uint16"))
    return str(out)


def loaders(data, audit, world, state=None, workers=0) -> list[StreamingDataLoader]:
    """One loader per simulated rank of a `world`-rank run over `data`, auditing into `audit`; each loads `state`."""
    out = []
    for rank in range(world):
        loader = StreamingDataLoader(StreamingDataset(data, seq_len=SEQ, rank=rank, world_size=world),
                                     batch_size=BATCH, num_workers=workers, audit=audit)
        if state is not None:
            loader.load_state_dict(state)
        out.append(loader)
    return out
