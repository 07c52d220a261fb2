"""`ShardWriter` refuses arguments that cannot work when it is made: one `ConfigError` line naming the
argument, its allowed range and what to pass, never a bare ValueError from inside a shard write later."""

from __future__ import annotations

import os

import pytest

from dataflow.cli import main
from dataflow.errors import ConfigError
from dataflow.formats.manifest import TokenizerMeta
from dataflow.formats.writer import ShardWriter

META = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
ZSTD_RANGE = "zstd levels run from 1 (fast) to 22 (small), and down to -131072 (faster still, larger)"


@pytest.mark.parametrize("kwargs, message", [
    (dict(zstd_level=40, format="tar"), f"zstd_level 40: {ZSTD_RANGE}; pass one of those"),
    (dict(zstd_level=40), f"zstd_level 40: {ZSTD_RANGE}"),
    (dict(zstd_level=23, format="tar", compression="zstd"), f"zstd_level 23: {ZSTD_RANGE}"),
    (dict(zstd_level=-131073), f"zstd_level -131073: {ZSTD_RANGE}"),
    (dict(zstd_level=2.5), f"zstd_level 2.5: {ZSTD_RANGE}"),
    (dict(zstd_level="3"), f"zstd_level '3': {ZSTD_RANGE}"),
    (dict(zstd_level=True), f"zstd_level True: {ZSTD_RANGE}"),
    (dict(zstd_level=3, compression="none"), "zstd_level 3 goes with compression='zstd', not 'none'"),
    (dict(shard_size=0), "shard_size: size 0 must be positive; pass a size like 128MB"),
    (dict(shard_size=-5), "shard_size: size -5 must be positive"),
    (dict(shard_size="lots"), "shard_size: cannot read size 'lots'; write it like 256MB"),
    (dict(shard_size=True), "shard_size True: pass a number of bytes, or a size like 256MB"),
    (dict(shard_size=1.5e6), "shard_size 1500000.0: pass a number of bytes"),
    (dict(shard_size="9GB"), "shard_size 9GB: above the 8GB a shard may hold; pass a smaller size"),
    (dict(format="parquet"), "format 'parquet': unknown shard format; choose one of arrow, tar"),
    (dict(compression="gzip"), "compression 'gzip': unknown; choose one of zstd, none"),
    (dict(tokenizer_meta=None), "tokenizer_meta: a NoneType, not a TokenizerMeta"),
    (dict(tokenizer_meta=TokenizerMeta(kind="bytes", name="x", vocab_size=0, eos_id=0)),
     "tokenizer_meta: tokenizer vocab_size 0 must be an integer in [1, 2^32]; pass the metadata of the tokenizer"),
    (dict(tokenizer_meta=TokenizerMeta(kind="bytes", name="x", vocab_size=2**33, eos_id=0)),
     "tokenizer vocab_size 8589934592 must be an integer in [1, 2^32]"),  # no token dtype holds it
    (dict(tokenizer_meta=TokenizerMeta(kind="bytes", name="x", vocab_size=100, eos_id=100)),
     "tokenizer eos_id 100 must be an id below vocab_size 100"),
    (dict(tokenizer_meta=TokenizerMeta(kind="sentencepiece", name="x", vocab_size=100, eos_id=0)),
     "unknown tokenizer kind 'sentencepiece'"),
    (dict(prefix="a/b-"), "prefix 'a/b-': shard names start with it, so it must be text without a path separator"),
    (dict(first_index=-1), "first_index -1: the number of the first shard must be an integer >= 0"),
])
def test_bad_arguments_are_refused_at_construction_in_one_line(tmp_path, kwargs, message):
    out = tmp_path / "out"
    kwargs = {"tokenizer_meta": META, **kwargs}
    with pytest.raises(ConfigError) as e:
        ShardWriter(str(out), **kwargs)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert not out.exists()  # refused before anything was made


@pytest.mark.parametrize("kwargs", [dict(format="tar", zstd_level=22), dict(format="tar", zstd_level=-131072),
                                    dict(zstd_level=0), dict(compression="none", format="tar"),
                                    dict(shard_size="8GB"), dict(shard_size=1), dict(first_index=3)])
def test_the_ends_of_each_range_still_write(tmp_path, kwargs):
    with ShardWriter(str(tmp_path), tokenizer_meta=META, **kwargs) as w:
        w.write([1, 2, 3], id="a")
    assert len(w.shards) == 1 and os.path.exists(tmp_path / w.shards[0].path)


@pytest.mark.parametrize("args, message", [
    (["--shard-size", "0"], "--shard-size: size '0' must be positive"),
    (["--shard-size", "9GB"], "--shard-size 9GB: above the 8GB a shard may hold"),
])
def test_tokenize_refuses_the_same_sizes_naming_its_flag(tmp_path, capsys, args, message):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    capsys.readouterr()
    assert main(["tokenize", str(src), "-o", str(tmp_path / "out"), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
