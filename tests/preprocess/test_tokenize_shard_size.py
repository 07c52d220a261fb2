"""`--shard-size` means what its help says: a shard ends with the document that reaches the size (token bytes,
before compression; documents never split), so every shard but the last of a bundle holds at least the size
and less than the size plus its last document; a bundle's end also ends its shards."""

from __future__ import annotations

import os

import numpy as np
import pytest

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_shard_documents
from dataflow.formats.writer import parse_size


@pytest.fixture(scope="module")
def part(kjv, tmp_path_factory):
    """The first 3,000 KJV records: about 1 MB of text, one unit."""
    import zstandard

    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    path = tmp_path_factory.mktemp("part") / "part.jsonl"
    path.write_bytes(b"".join(lines[:3000]))
    return path


def shard_lengths(folder) -> tuple[list[list[int]], int]:
    """Each shard's documents' token counts, in order, and the bytes of a token."""
    manifest = read_manifest(str(folder))
    return [[len(tokens) for _, tokens in iter_shard_documents(os.path.join(folder, s.path), manifest, s)]
            for s in manifest.shards], np.dtype(manifest.dtype).itemsize


@pytest.mark.parametrize("tokenizer, size, fmt", [("bytes", "64KB", "arrow"), (GPT2_JSON, "24KB", "tar"),
                                                  (GPT2_JSON, "50000", "arrow")])
def test_a_shard_ends_with_the_document_that_reaches_the_size(part, tmp_path, tokenizer, size, fmt):
    out = tmp_path / "out"
    assert main(["tokenize", str(part), "-o", str(out), "--tokenizer", str(tokenizer), "--shard-size", size,
                 "--format", fmt, "--no-progress", "--workers", "1"]) == 0  # one bundle: the file is one unit
    shards, itemsize = shard_lengths(out)
    limit = parse_size(size)
    assert len(shards) > 3
    for docs in shards[:-1]:
        held = sum(docs) * itemsize
        assert limit <= held < limit + docs[-1] * itemsize, (held, docs[-1])  # the last one reached it
        assert (sum(docs) - docs[-1]) * itemsize < limit  # and not one before it
    assert sum(shards[-1]) * itemsize < limit + shards[-1][-1] * itemsize


def test_bundles_end_shards_below_the_size_never_above_it_by_more_than_a_document(kjv, tmp_path):
    out = tmp_path / "out"
    assert main(["tokenize", str(kjv), "-o", str(out), "--shard-size", "96KB", "--unit-size", "256KB",
                 "--no-progress", "--workers", "2"]) == 0
    shards, itemsize = shard_lengths(out)
    limit = parse_size("96KB")
    assert any(sum(d) * itemsize < limit for d in shards[:-1])  # a bundle's end ended some early
    for docs in shards:
        assert (sum(docs) - docs[-1]) * itemsize < limit  # every shard ends at the latest with the document reaching it
