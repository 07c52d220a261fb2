"""ShardWriter, Arrow and tar shards, the manifest: round trips, checksums, validation."""

import hashlib
import json
import os

import numpy as np
import pytest
import webdataset as wds

from dataflow import FormatError, ShardWriter, TokenizerMeta
from dataflow.formats.arrow import ArrowShard
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


def _docs(n, seed=0, vocab=257):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=rng.integers(1, 300)) for _ in range(n)]


@pytest.mark.parametrize("fmt,comp", [("arrow", "zstd"), ("arrow", "none"), ("tar", "zstd"), ("tar", "none")])
def test_writer_round_trip(tmp_path, fmt, comp):
    docs = _docs(500)
    with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, format=fmt, compression=comp, shard_size="20KB") as w:
        for i, d in enumerate(docs):
            w.write(d, id=f"doc-{i}")
    m = read_manifest(str(tmp_path))
    assert len(m.shards) >= 3
    assert m.documents == 500 and m.tokens == sum(len(d) for d in docs)
    back = list(iter_documents(str(tmp_path), m))
    assert [i for i, _ in back] == [f"doc-{i}" for i in range(500)]
    for (_, got), want in zip(back, docs):
        np.testing.assert_array_equal(got, want)
    for s in m.shards:  # checksums and sizes describe the real files
        data = (tmp_path / s.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s.sha256 and len(data) == s.bytes
        assert not os.path.isabs(s.path)


@pytest.mark.parametrize("fmt,batch_tokens", [("arrow", 1 << 21), ("arrow", 700), ("tar", 1 << 21)])
def test_write_batch_gives_the_shards_of_one_by_one_writes(tmp_path, monkeypatch, fmt, batch_tokens):
    """Batches that straddle shard (and record batch) boundaries, and batches of one, cut shards exactly where
    single writes do, byte for byte."""
    import dataflow.formats.arrow as arrow
    from dataflow.formats.writer import DocIds

    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", batch_tokens)

    docs = _docs(700, seed=3)
    ids = [f"doc-{i}-é" for i in range(700)]  # non-ASCII: offsets are in bytes
    with ShardWriter(str(tmp_path / "one"), tokenizer_meta=BYTES, format=fmt, shard_size="9KB") as w:
        for d, i in zip(docs, ids):
            w.write(d, id=i)
    rng = np.random.default_rng(0)
    with ShardWriter(str(tmp_path / "many"), tokenizer_meta=BYTES, format=fmt, shard_size="9KB") as w:
        start, completed = 0, []
        while start < len(docs):
            stop = min(len(docs), start + int(rng.integers(1, 120)))
            part = docs[start:stop]
            offsets = np.concatenate([[0], np.cumsum([len(d) for d in part])])
            completed += w.write_batch(np.concatenate(part), offsets, DocIds.from_list(ids[start:stop]))
            start = stop
    a, b = read_manifest(str(tmp_path / "one")), read_manifest(str(tmp_path / "many"))
    assert len(a.shards) >= 10 and [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    assert [s.path for s in completed] == [s.path for s in b.shards[:len(completed)]]
    with pytest.raises(Exception, match="token ids must lie"):
        ShardWriter(str(tmp_path / "bad"), tokenizer_meta=BYTES).write_batch(
            np.array([1, -1]), np.array([0, 2]), DocIds.from_list(["x"]))


def test_tar_shards_read_by_webdataset(tmp_path):
    docs = _docs(20)
    with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, format="tar", compression="none") as w:
        for i, d in enumerate(docs):
            w.write(d, id=f"d{i}")
    path = str(tmp_path / read_manifest(str(tmp_path)).shards[0].path)
    samples = list(wds.WebDataset(path, shardshuffle=False).decode())
    assert len(samples) == 20
    np.testing.assert_array_equal(samples[3]["tokens.npy"], docs[3])
    assert samples[3]["json"]["id"] == "d3"


def test_uint32_tokens_for_large_vocab(tmp_path):
    meta = TokenizerMeta(kind="hf", name="big", vocab_size=200_000, eos_id=199_999)
    docs = _docs(10, vocab=200_000)
    with ShardWriter(str(tmp_path), tokenizer_meta=meta) as w:
        for d in docs:
            w.write(d)
    m = read_manifest(str(tmp_path))
    assert m.dtype == "uint32"
    got = [t for _, t in iter_documents(str(tmp_path), m)]
    assert got[0].dtype == np.uint32 and all((a == b).all() for a, b in zip(got, docs))


def test_arrow_record_batches_and_layout(tmp_path, monkeypatch):
    import dataflow.formats.arrow as arrow

    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", 1000)
    docs = _docs(100)
    with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, compression="none") as w:
        for d in docs:
            w.write(d)
    shard = ArrowShard(str(tmp_path / "shard-00000.arrow"))
    assert shard.num_batches > 5
    assert shard.num_tokens == sum(len(d) for d in docs) and shard.num_documents == 100
    # every record batch but the last closes with the document that brings it to RECORD_BATCH_TOKENS
    lengths, start = [len(d) for d in docs], 0
    for i in range(shard.num_batches):
        n = int(shard.batch_docs[i])
        assert sum(lengths[start:start + n]) == shard.batch_tokens[i]
        if i < shard.num_batches - 1:
            assert sum(lengths[start:start + n - 1]) < 1000 <= sum(lengths[start:start + n])
        start += n
    values, offsets, ids = shard.batch(2)
    np.testing.assert_array_equal(values[offsets[0]:offsets[1]], docs[int(shard.batch_docs[:2].sum())])


def test_an_unfinished_arrow_shard_is_never_seen(tmp_path, monkeypatch):
    """Record batches go to disk as they fill, under a hidden temp name: an exception leaves no shard and no
    temp file, and the shards before it intact."""
    import dataflow.formats.arrow as arrow

    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", 500)
    docs = _docs(200)
    with pytest.raises(RuntimeError):
        with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, shard_size="20KB") as w:
            for d in docs:
                w.write(d)
                if w.shards and len(os.listdir(tmp_path)) == 2:  # one shard done, the next one being written
                    hidden = [n for n in os.listdir(tmp_path) if n.startswith(".")]
                    assert hidden and hidden[0].endswith(".tmp") and w._file.layout
                    raise RuntimeError("stop")
    assert sorted(os.listdir(tmp_path)) == ["shard-00000.arrow"]
    assert ArrowShard(str(tmp_path / "shard-00000.arrow")).num_documents == w.shards[0].documents


def test_writer_rejects_out_of_range_tokens(tmp_path):
    from dataflow.errors import ConfigError

    with pytest.raises(ConfigError, match="token ids"):
        with ShardWriter(str(tmp_path), tokenizer_meta=BYTES) as w:
            w.write(np.array([70000]))
    assert not (tmp_path / "index.json").exists()  # no manifest after a failure


def test_manifest_rejects_escaping_paths(tmp_path):
    with ShardWriter(str(tmp_path), tokenizer_meta=BYTES) as w:
        w.write([1, 2, 3])
    index = tmp_path / "index.json"
    for bad in ("../evil.arrow", "/etc/passwd", "s3://x/y"):
        d = json.loads(index.read_text())
        d["shards"][0]["path"] = bad
        index.write_text(json.dumps(d))
        with pytest.raises(FormatError, match="relative"):
            read_manifest(str(tmp_path))


def test_manifest_errors_are_clear(tmp_path):
    with pytest.raises(FormatError, match="no manifest"):
        read_manifest(str(tmp_path))
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        read_manifest(str(tmp_path))
    (tmp_path / "index.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(FormatError, match="newer"):
        read_manifest(str(tmp_path))


def test_a_failed_background_write_is_raised_not_lost(tmp_path, monkeypatch):
    """Record batches are compressed and written on a thread: when writing fails there (here: the file is gone
    from under it, as on a failed disk), the writer's next call raises, and no shard or manifest claims the data."""
    import dataflow.formats.arrow as arrow

    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", 500)
    docs = _docs(300)
    with pytest.raises(Exception, match="closed file"):
        with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, shard_size="1MB") as w:
            for i, d in enumerate(docs):
                w.write(d)
                if w._file is not None and i == 50:
                    w._file._sink.close()  # every later write of the shard fails on the writer's thread
    assert not (tmp_path / "index.json").exists()
    assert os.listdir(tmp_path) == []  # the unfinished shard's temp file is removed


@pytest.mark.parametrize("path", ["%2e%2e/x.arrow", "a/%252e%252e/%252e%252e/x.arrow", "%2fetc/x", "..%5cx.arrow",
                                  "../x.arrow", "/abs.arrow", "c:/x.arrow", "%25252e%25252e/x"])
def test_a_manifest_whose_shard_path_leaves_the_dataset_in_any_encoding_is_refused_when_read(tmp_path, path):
    """Format rule 3 holds for every reader (verify, inspect, decode, the loader), not only the http one."""
    import json

    from dataflow import FormatError, ShardWriter, TokenizerMeta
    from dataflow.formats.manifest import read_manifest

    with ShardWriter(str(tmp_path), tokenizer_meta=TokenizerMeta(kind="bytes", name="bytes", vocab_size=257,
                                                                 eos_id=256)) as w:
        w.write([1, 2, 3], id="a")
    index = json.loads((tmp_path / "index.json").read_text())
    index["shards"][0]["path"] = path
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match="must be relative and stay inside the dataset, but leaves it"):
        read_manifest(str(tmp_path))


def test_writer_refuses_ids_past_the_vocabulary_and_non_integers(tmp_path):
    """An id at or past vocab_size (even in an array of the shard's own dtype) or a float is refused where it is
    written, in one line: it was stored, and every reader then called the shard damaged (a float cut to an int)."""
    from dataflow.errors import ConfigError

    llama = TokenizerMeta(kind="hf", name="llama3", vocab_size=128256, eos_id=128001)
    for meta, doc in ((BYTES, np.array([1, 257], dtype=np.uint16)), (BYTES, [1, 300, 2]),
                      (llama, np.array([128256], dtype=np.uint32)), (BYTES, [1, 2.9])):
        with pytest.raises(ConfigError) as e:
            with ShardWriter(str(tmp_path / "w"), tokenizer_meta=meta) as w:
                w.write(doc, id="x")
        assert "\n" not in str(e.value) and "'x'" in str(e.value) and not (tmp_path / "w" / "index.json").exists()
        with pytest.raises(ConfigError, match="write_batch: token ids"):
            with ShardWriter(str(tmp_path / "b"), tokenizer_meta=meta) as w:
                w.write_batch(np.asarray(doc), np.array([0, len(doc)]), ["x"])
    with ShardWriter(str(tmp_path / "ok"), tokenizer_meta=BYTES) as w:  # the last id of the vocabulary is one
        w.write(np.array([0, 256], dtype=np.uint16))
        w.write([])
