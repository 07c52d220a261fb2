"""Hostile and damaged data: nothing is served corrupt, nothing is written outside its folder, every
mistake is one clear error (the reliability issue's M1, H3, L4, L5, L7, L8)."""

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest
import zstandard

from dataflow import ConfigError, FormatError, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats.manifest import read_manifest

SEQ = 16


def write(out, vocab: int, tokens: np.ndarray, docs: int = 20, **kw) -> str:
    meta = TokenizerMeta(kind="hf", name="t", vocab_size=vocab, eos_id=vocab - 1)
    with ShardWriter(str(out), tokenizer_meta=meta, shard_size="8KB", **kw) as w:
        for doc in np.array_split(tokens, docs):
            w.write(doc)
    return str(out)


def edit_manifest(path: str, change) -> None:
    index = os.path.join(path, "index.json")
    with open(index) as f:
        d = json.load(f)
    change(d)
    with open(index, "w") as f:
        json.dump(d, f)


def drain(path: str, workers: int = 0) -> None:
    for _ in StreamingDataLoader(StreamingDataset(path, seq_len=SEQ), batch_size=2, num_workers=workers):
        pass


@pytest.mark.parametrize("workers", [0, 1])
def test_ids_outside_the_vocabulary_stop_the_loader_naming_the_shard(tmp_path, workers):
    path = write(tmp_path / "d", 65536, np.arange(20_000) + 40_000)
    edit_manifest(path, lambda d: d["tokenizer"].update(vocab_size=50_257, eos_id=50_256))  # ids up to 59,999
    with pytest.raises(FormatError, match=r"shard-\d+\.arrow: .*token id \d+, outside the vocabulary of 50257"):
        drain(path, workers)


def test_a_token_column_wider_than_the_manifest_says_is_refused(tmp_path):
    path = write(tmp_path / "d", 70_000, np.arange(20_000) % 60_000)  # uint32 shards
    edit_manifest(path, lambda d: (d["tokenizer"].update(vocab_size=60_000, eos_id=59_999), d.update(dtype="uint16")))
    with pytest.raises(FormatError, match="holds uint32 tokens, the manifest says uint16"):
        drain(path)


@pytest.mark.parametrize("field,value,message", [
    ("shard_sha", "/tmp/escape/" + "0" * 52, "not a sha256"),
    ("shard_path", "../outside.arrow", "must be relative"),
    ("tok_file", "../payload.json", "tokenizer file"),
    ("vocab", -1, "vocab_size"),
    ("vocab", "257", "vocab_size"),
    ("eos", 70_000, "eos_id"),
])
def test_hostile_manifest_fields_are_refused_at_read(tmp_path, field, value, message):
    path = write(tmp_path / "d", 65536, np.arange(5_000))

    def change(d):
        if field == "shard_sha":
            d["shards"][0]["sha256"] = value
        elif field == "shard_path":
            d["shards"][0]["path"] = value
        elif field == "tok_file":
            d["tokenizer"]["file"] = value
        elif field == "vocab":
            d["tokenizer"]["vocab_size"] = value
        else:
            d["tokenizer"]["eos_id"] = value

    edit_manifest(path, change)
    with pytest.raises(FormatError, match=message):
        read_manifest(path)


def test_an_uppercase_sha256_is_the_same_digest(tmp_path):
    path = write(tmp_path / "d", 65536, np.arange(5_000))
    edit_manifest(path, lambda d: [s.update(sha256=s["sha256"].upper()) for s in d["shards"]])
    m = read_manifest(path)
    assert all(s.sha256 == s.sha256.lower() for s in m.shards)
    drain(path)


def test_a_compressed_tar_bomb_is_refused_before_it_fills_memory(tmp_path):
    path = write(tmp_path / "d", 65536, np.arange(5_000), docs=5, format="tar", compression="zstd")
    m = read_manifest(path)
    first = m.shards[0]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # 200 MB of zeros behind a 1-document manifest entry
        info = tarfile.TarInfo("big.bin")
        info.size = 200 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    bomb = zstandard.ZstdCompressor(level=3).compress(buf.getvalue())
    with open(os.path.join(path, first.path), "wb") as f:
        f.write(bomb)

    def change(d):
        d["shards"][0].update(bytes=len(bomb), sha256=hashlib.sha256(bomb).hexdigest())

    edit_manifest(path, change)
    with pytest.raises(FormatError, match="decompresses beyond"):
        drain(path)


@pytest.mark.parametrize("override,message", [("train.lr=inf", "finite"), ("train.lr=nan", "finite"),
                                              ("model.mlp_ratio=0", "positive"), ("model.dropout=1.0", "dropout")])
def test_trainer_refuses_non_finite_or_out_of_range_settings(override, message):
    from trainer.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.toml"), [override])
