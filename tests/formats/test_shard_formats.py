"""The shard format as an interface (`formats.shard_format`): Arrow and tar answer the same operations (write,
open and check, iterate, decode, size bounds) the same way, on real documents (KJV text, byte tokens)."""

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pytest
import zstandard

from dataflow import FormatError, ShardWriter, TokenizerMeta
from dataflow.formats import shard_format
from dataflow.formats.manifest import FORMATS, read_manifest
from dataflow.formats.shard_formats import CheckedShard

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


def kjv_docs(kjv, n: int = 24) -> list[tuple[str, np.ndarray]]:
    with open(kjv, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        lines = r.read(1 << 20).decode("utf-8", "ignore").splitlines()[:n]
    return [(f"kjv-{i}", np.frombuffer(json.loads(line)["text"][:600].encode(), np.uint8).astype(np.uint16))
            for i, line in enumerate(lines)]


def _write(out, docs, fmt: str, compression: str):
    with ShardWriter(str(out), tokenizer_meta=BYTES, format=fmt, compression=compression, shard_size="1GB") as w:
        for doc_id, tokens in docs:
            w.write(tokens, id=doc_id)
    manifest = read_manifest(str(out))
    return manifest, manifest.shards[0], os.path.join(out, manifest.shards[0].path)


def _documents(shard: CheckedShard) -> list[tuple[str, list[int]]]:
    out = []
    for i in range(shard.num_batches):
        values, offsets, ids = shard.batch(i)
        ids = ids.to_pylist() if hasattr(ids, "to_pylist") else list(ids)
        out += [(doc_id, values[offsets[j]:offsets[j + 1]].tolist()) for j, doc_id in enumerate(ids)]
    return out


def test_every_format_a_manifest_may_name_has_one_and_nothing_else_does():
    assert [shard_format(name).name for name in FORMATS] == list(FORMATS)
    with pytest.raises(FormatError) as e:
        shard_format("parquet")
    assert str(e.value) == "unknown shard format 'parquet': expected one of arrow, tar"


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_both_formats_open_check_and_iterate_the_same_documents(kjv, tmp_path, compression):
    docs = kjv_docs(kjv)
    got = {}
    for fmt in FORMATS:
        manifest, info, path = _write(tmp_path / fmt, docs, fmt, compression)
        assert path.endswith(shard_format(fmt).extension(compression))
        shard = CheckedShard(path, fmt, info, manifest.dtype, BYTES.vocab_size, name=info.path)
        assert int(shard.token_starts[-1]) == info.tokens and int(shard.doc_starts[-1]) == info.documents
        got[fmt] = _documents(shard)
    assert got["arrow"] == got["tar"] == [(doc_id, tokens.tolist()) for doc_id, tokens in docs]


@pytest.mark.parametrize("fmt,where", [("arrow", "record batch 0"), ("tar", "document 'kjv-0'")])
def test_both_formats_refuse_a_shard_unlike_its_entry_in_the_same_words(kjv, tmp_path, fmt, where):
    manifest, info, path = _write(tmp_path, kjv_docs(kjv), fmt, "zstd")
    short = dataclasses.replace(info, documents=info.documents - 1)
    with pytest.raises(FormatError, match=f"^{info.path}: .*{info.documents} documents"):
        CheckedShard(path, fmt, short, manifest.dtype, BYTES.vocab_size, name=info.path)
    shard = CheckedShard(path, fmt, info, manifest.dtype, 100, name=info.path)  # a vocabulary too small
    with pytest.raises(FormatError, match=f"^{info.path}: {where} holds token id .* outside the vocabulary of 100"):
        shard.batch(0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_format_s_sink_writes_the_bytes_the_shard_writer_writes(kjv, tmp_path, fmt):
    docs = kjv_docs(kjv)
    _, info, path = _write(tmp_path / "writer", docs, fmt, "zstd")
    values = np.concatenate([tokens for _, tokens in docs])
    offsets = np.concatenate([[0], np.cumsum([len(tokens) for _, tokens in docs])])
    sink = shard_format(fmt).create(str(tmp_path / info.path), "uint16", "zstd", None, 1 << 30)
    sink.add(values, offsets, pa.array([doc_id for doc_id, _ in docs], pa.string()))
    assert sink.commit() == (info.bytes, info.sha256)
    assert (tmp_path / info.path).read_bytes() == open(path, "rb").read()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_decoded_copy_opens_as_its_shard_within_the_format_s_bounds(kjv, tmp_path, fmt):
    docs = kjv_docs(kjv)
    manifest, info, path = _write(tmp_path / "ds", docs, fmt, "zstd")
    form = shard_format(fmt)
    copy = str(tmp_path / f"copy.decoded.{fmt}")
    size = form.decode(path, copy, info, 2, name=info.path)
    assert size == os.path.getsize(copy) <= form.decoded_bound(info)
    assert form.decoded_estimate(info, 2) >= sum(len(t) for _, t in docs) * 2
    shard = CheckedShard(copy, fmt, info, manifest.dtype, BYTES.vocab_size, name=info.path, decoded_from=info.sha256)
    assert _documents(shard) == [(doc_id, tokens.tolist()) for doc_id, tokens in docs]
    if fmt == "arrow":  # an Arrow copy records whose copy it is
        with pytest.raises(FormatError, match="this decoded copy is not of the shard the manifest names"):
            CheckedShard(copy, fmt, info, manifest.dtype, BYTES.vocab_size, name=info.path, decoded_from="0" * 64)
