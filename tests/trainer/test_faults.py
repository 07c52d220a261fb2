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
from support.data import edit_manifest

SEQ = 16


def write(out, vocab: int, tokens: np.ndarray, docs: int = 20, **kw) -> str:
    meta = TokenizerMeta(kind="hf", name="t", vocab_size=vocab, eos_id=vocab - 1)
    with ShardWriter(str(out), tokenizer_meta=meta, shard_size="8KB", **kw) as w:
        for doc in np.array_split(tokens, docs):
            w.write(doc)
    return str(out)


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
        load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "demo.toml"), [override])


def rehash(path: str, index: int) -> None:
    """Make the manifest agree with a shard file's new bytes (what an attacker or a buggy tool would do)."""
    shard = read_manifest(path).shards[index]
    data = open(os.path.join(path, shard.path), "rb").read()

    def change(d):
        d["shards"][index].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    edit_manifest(path, change)


def tar_bytes(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_verify_reports_every_bad_shard_in_one_line_each(tmp_path, capsys):
    from dataflow.cli import main

    path = write(tmp_path / "d", 65536, 45_000 + np.arange(60_000) % 5_000, docs=60)
    m = read_manifest(path)
    assert len(m.shards) >= 4
    first = os.path.join(path, m.shards[0].path)  # 1: a flipped byte (manifest untouched)
    data = bytearray(open(first, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(first, "wb").write(bytes(data))
    second = os.path.join(path, m.shards[1].path)  # 2: garbage layout metadata, hash updated to match
    raw = open(second, "rb").read()
    open(second, "wb").write(raw.replace(b'[[', b'[{'))
    rehash(path, 1)
    edit_manifest(path, lambda d: d["tokenizer"].update(vocab_size=40_000, eos_id=39_999))  # 3: ids beyond vocab
    assert main(["verify", path, "--no-progress"]) == 1
    err = capsys.readouterr().err
    bad = [line for line in err.splitlines() if line.startswith("BAD ")]
    assert len(bad) == len(m.shards)  # every shard reported, none stopped the run
    assert "corrupt" in bad[0] and "layout" in bad[1]
    assert all("outside the vocabulary of 40000" in line for line in bad[2:])
    assert "Traceback" not in err


@pytest.mark.parametrize("members,message", [
    ([("d0.json", b'{"id": "d0"}'), ("d0.tokens.npy", None)], "damaged tar shard"),
    ([("dir", None)], "not a regular file"),
])
def test_verify_rejects_the_tar_shards_the_loader_rejects(tmp_path, capsys, members, message):
    from dataflow.cli import main

    path = write(tmp_path / "d", 65536, np.arange(100), docs=1, format="tar", compression="none")
    npy = io.BytesIO()
    np.save(npy, np.arange(100, dtype=np.uint16))
    members = [(n, npy.getvalue() if n.endswith(".npy") else d) for n, d in members]
    shard = read_manifest(path).shards[0]
    open(os.path.join(path, shard.path), "wb").write(tar_bytes(members))
    rehash(path, 0)
    with pytest.raises(FormatError, match=message):
        drain(path)
    assert main(["verify", path, "--no-progress"]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("state", [{"step": 3}, {"step": "3", "world_size": 1, "loader": {}, "counters": {}},
                                   ["not", "a", "dict"]])
def test_a_damaged_checkpoint_state_is_one_clear_error(tmp_path, state):
    from trainer.checkpoint import STATE_FILE, STATE_VERSION, Checkpointer
    from trainer.parallelize import Dist

    folder = tmp_path / "step-000003"
    folder.mkdir()
    if isinstance(state, dict):
        state = {"version": STATE_VERSION, **state}
    (folder / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(FormatError, match="step-000003"):
        Checkpointer(str(tmp_path), 1, Dist()).load(str(folder), None, None)


@pytest.mark.parametrize("position", [0.3, 0.5, 0.8])
def test_a_flipped_byte_in_a_local_zstd_shard_is_caught_before_training_on_it(tmp_path, position):
    """Local zstd shards are decoded once per machine, after their sha256 is checked against the manifest."""
    path = write(tmp_path / "d", 65536, np.arange(20_000) % 60_000)
    shard = os.path.join(path, read_manifest(path).shards[0].path)
    data = bytearray(open(shard, "rb").read())
    data[int(len(data) * position)] ^= 0x01
    open(shard, "wb").write(bytes(data))
    with pytest.raises(FormatError, match="sha256 does not match the manifest"):
        drain(path)
