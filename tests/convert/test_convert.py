"""`dataflow convert` as a whole: --tokenizer as tokenize reads it, help, atomic outputs, bounded memory."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tracemalloc

import numpy as np
import pytest
from support.convert import convert, documents, one_line_error

from dataflow.cli import build_parser, main
from dataflow.formats.manifest import read_manifest
from tools import repo_data


def test_every_flag_has_help_and_the_command_is_listed(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "convert" in sub.choices and "convert" in parser.format_help()
    text = sub.choices["convert"].format_help()
    for action in sub.choices["convert"]._actions:
        if not isinstance(action, argparse._HelpAction):
            assert action.help, action.option_strings
    for flag in ("--from", "--to", "--tokenizer", "--dtype", "--eos-id", "--overwrite", "--no-progress", "--debug"):
        assert flag in text
    with pytest.raises(SystemExit) as e:
        main(["convert", "x", "-o", "y"])  # neither --from nor --to
    assert e.value.code == 2


@pytest.mark.parametrize("spec", ["bytes", "tiktoken", "json"])
def test_tokenizer_means_what_it_means_to_tokenize(tmp_path, capsys, spec):
    spec = {"bytes": "bytes", "tiktoken": f"tiktoken:{repo_data.gpt2_tiktoken()}",
            "json": str(repo_data.gpt2_json())}[spec]
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    assert main(["tokenize", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "tok"), "--tokenizer", spec,
                 "--workers", "1", "--no-progress"]) == 0
    tokenized = documents(str(tmp_path / "tok"))
    tokenized[0][1].astype(np.uint16).tofile(tmp_path / "hello.bin")
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "hello.bin"), "-o", str(tmp_path / "conv"),
                           "--tokenizer", spec)
    assert code == 0, err
    a, b = read_manifest(str(tmp_path / "tok")).tokenizer, read_manifest(str(tmp_path / "conv")).tokenizer
    assert dataclasses.asdict(a) == dataclasses.asdict(b) | {"framing": dataclasses.asdict(a)["framing"]}
    assert b.framing is None  # convert takes stored ids as they are: it frames nothing, and says nothing of it
    if a.file:
        assert (tmp_path / "tok" / a.file).read_bytes() == (tmp_path / "conv" / b.file).read_bytes()
    capsys.readouterr()
    assert main(["decode", str(tmp_path / "conv"), "--no-progress"]) == 0
    assert '"text": "hello"' in capsys.readouterr().out


def test_a_failed_overwrite_keeps_the_old_dataset_whole(tmp_path, capsys):
    np.array([1, 2, 256], dtype=np.uint16).tofile(tmp_path / "good.bin")
    np.array([1, 2, 256, 3, 999], dtype=np.uint16).tofile(tmp_path / "bad.bin")  # 999: beyond the vocabulary
    assert convert(capsys, "--from", "nanogpt", str(tmp_path / "good.bin"), "-o", str(tmp_path / "ds"),
                   "--tokenizer", "bytes")[0] == 0
    before = {n: (tmp_path / "ds" / n).read_bytes() for n in os.listdir(tmp_path / "ds")}
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "bad.bin"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes", "--overwrite")
    one_line_error(err, code, 2, "bad.bin:1", "999")
    assert {n: (tmp_path / "ds" / n).read_bytes() for n in os.listdir(tmp_path / "ds")} == before
    assert sorted(os.listdir(tmp_path)) == ["bad.bin", "ds", "good.bin"]  # no temp left behind


def test_an_empty_output_folder_is_no_obstacle_and_a_file_needs_overwrite(tmp_path, capsys):
    np.array([1, 256], dtype=np.uint16).tofile(tmp_path / "f.bin")
    (tmp_path / "empty").mkdir()
    args = ["--from", "nanogpt", str(tmp_path / "f.bin"), "--tokenizer", "bytes", "-o"]
    assert convert(capsys, *args, str(tmp_path / "empty"))[0] == 0
    assert read_manifest(str(tmp_path / "empty")).documents == 1
    (tmp_path / "other").write_text("not a dataset")
    code, _, err = convert(capsys, *args, str(tmp_path / "other"))
    one_line_error(err, code, 2, "exists", "--overwrite")


@pytest.mark.parametrize("out", ["in.bin", ".", "ds", "ds/shard-00000.arrow"])
def test_an_output_that_is_holds_or_lies_in_an_input_is_refused_even_with_overwrite(tmp_path, capsys, out):
    # --overwrite once replaced the input itself (a folder holding the .bin, the dataset's own shard)
    np.array([1, 256, 2, 256], dtype=np.uint16).tofile(tmp_path / "in.bin")
    assert convert(capsys, "--from", "nanogpt", str(tmp_path / "in.bin"), "--tokenizer", "bytes", "-o",
                   str(tmp_path / "ds"))[0] == 0
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    if out.startswith("ds"):
        args = ["--to", "nanogpt", str(tmp_path / "ds")]
    else:
        args = ["--from", "nanogpt", str(tmp_path / "in.bin"), "--tokenizer", "bytes"]
    code, _, err = convert(capsys, *args, "-o", str(tmp_path / out), "--overwrite")
    one_line_error(err, code, 2, "is, holds or lies inside the input", "write elsewhere")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_overwrite_replaces_a_dataset_not_a_folder_of_other_files(tmp_path, capsys):
    np.array([1, 256], dtype=np.uint16).tofile(tmp_path / "f.bin")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "f.bin"), "--tokenizer", "bytes", "-o",
                           str(tmp_path / "notes"), "--overwrite")
    one_line_error(err, code, 2, "a folder that holds no dataset", "new or empty folder")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def _peak_above_baseline(fn) -> float:
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    return tracemalloc.get_traced_memory()[1] - base


def test_memory_stays_bounded_whatever_the_input_size(tmp_path, monkeypatch):
    """32 MB of tokens through all four conversions in small batches: no step holds the input."""
    from dataflow.convert import common, nanogpt, run

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=16_000_000).astype(np.uint16)
    tokens[rng.integers(0, len(tokens), size=8000)] = 256
    tokens.tofile(tmp_path / "big.bin")
    del tokens
    np.array([1, 256], dtype=np.uint16).tofile(tmp_path / "small.bin")
    opts = run.WriteOptions(shard_size="4MB")

    def all_four(src: str, tag: str) -> list[float]:
        return [_peak_above_baseline(f) for f in (
            lambda: run.from_nanogpt([src], str(tmp_path / f"ds{tag}"), "bytes", opts, run.ConvertProgress()),
            lambda: run.to_megatron([str(tmp_path / f"ds{tag}")], str(tmp_path / f"mg{tag}"), False, run.ConvertProgress()),
            lambda: run.from_megatron([str(tmp_path / f"mg{tag}")], str(tmp_path / f"re{tag}"), "bytes", opts,
                                      run.ConvertProgress()),
            lambda: run.to_nanogpt([str(tmp_path / f"re{tag}")], str(tmp_path / f"back{tag}.bin"), False,
                                   run.ConvertProgress()))]

    tracemalloc.start()
    try:
        all_four(str(tmp_path / "small.bin"), "warm")  # imports and first-use caches are not the conversion's
        monkeypatch.setattr(common, "BATCH_TOKENS", 1 << 16)
        monkeypatch.setattr(run, "BATCH_TOKENS", 1 << 16)
        monkeypatch.setattr(nanogpt, "CHUNK_TOKENS", 1 << 16)
        peaks = all_four(str(tmp_path / "big.bin"), "")
    finally:
        tracemalloc.stop()
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "big.bin").read_bytes()
    mb = [round(p / 1e6, 1) for p in peaks]
    assert max(mb[0], mb[2]) < 12, mb  # the writer's record batch (2M tokens) and our batch, not 32 MB
    assert max(mb[1], mb[3]) < 4, mb  # a batch of documents at a time


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_tar_shards_convert_both_ways_like_arrow(tmp_path, capsys, compression):
    flat = np.array([5, 6, 256, 7, 256, 8, 9, 10, 256], dtype=np.uint16)
    flat.tofile(tmp_path / "f.bin")
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "f.bin"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes", "--format", "tar", "--compression", compression,
                           "--shard-size", "4B")
    assert code == 0, err
    m = read_manifest(str(tmp_path / "ds"))
    assert m.format == "tar" and len(m.shards) == 3
    assert [t.tolist() for _, t in documents(str(tmp_path / "ds"))] == [[5, 6, 256], [7, 256], [8, 9, 10, 256]]
    assert convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", str(tmp_path / "back.bin"))[0] == 0
    assert (tmp_path / "back.bin").read_bytes() == flat.tobytes()


def test_progress_on_stderr_and_a_mistake_is_its_line_alone(tmp_path, capsys):
    np.array([1, 256] * 1000, dtype=np.uint16).tofile(tmp_path / "f.bin")
    capsys.readouterr()
    assert main(["convert", "--from", "nanogpt", str(tmp_path / "f.bin"), "-o", str(tmp_path / "ds"),
                 "--tokenizer", "bytes"]) == 0
    out = capsys.readouterr()
    assert "convert: 100%" in out.err and "2.00k/2.00k" in out.err
    assert out.out == f"converted 1,000 documents, 2,000 uint16 tokens from 1 input into 1 shard in {tmp_path / 'ds'}\n"
    assert main(["convert", "--from", "nanogpt", str(tmp_path / "f.bin"), "-o", str(tmp_path / "ds"),
                 "--tokenizer", "bytes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dataflow convert: error: ") and "--overwrite" in err


def test_an_input_named_twice_in_any_spelling_is_refused(tmp_path, capsys):
    # `p` and `p.idx` (one Megatron prefix), or `ds` and `ds/`, once converted the same documents twice
    np.array([1, 256, 2, 256], dtype=np.uint16).tofile(tmp_path / "f.bin")
    assert convert(capsys, "--from", "nanogpt", str(tmp_path / "f.bin"), "--tokenizer", "bytes", "-o",
                   str(tmp_path / "ds"))[0] == 0
    assert convert(capsys, "--to", "megatron", str(tmp_path / "ds"), "-o", str(tmp_path / "m"))[0] == 0
    for argv in (["--to", "nanogpt", str(tmp_path / "ds"), str(tmp_path / "ds") + "/"],
                 ["--from", "megatron", str(tmp_path / "m"), str(tmp_path / "m.idx"), "--tokenizer", "bytes"],
                 ["--from", "nanogpt", str(tmp_path / "f.bin"), str(tmp_path / "." / "f.bin"), "--tokenizer", "bytes"]):
        code, _, err = convert(capsys, *argv, "-o", str(tmp_path / "out.bin"))
        one_line_error(err, code, 2, "the same input as", "name each input once")


def test_to_megatron_takes_a_prefix_not_a_folder(tmp_path, capsys):
    np.array([1, 256], dtype=np.uint16).tofile(tmp_path / "f.bin")
    assert convert(capsys, "--from", "nanogpt", str(tmp_path / "f.bin"), "--tokenizer", "bytes", "-o",
                   str(tmp_path / "ds"))[0] == 0
    code, _, err = convert(capsys, "--to", "megatron", str(tmp_path / "ds"), "-o", str(tmp_path) + "/")
    one_line_error(err, code, 2, "takes a prefix", "not a folder")
    assert not (tmp_path / ".bin").exists()
