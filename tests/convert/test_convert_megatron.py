"""`dataflow convert --from/--to megatron`, checked with megatron-core's own IndexedDataset and builder."""

from __future__ import annotations

import functools
import os
import struct
import warnings

import numpy as np
import pytest
import torch
from support.convert import convert, documents, kjv_gpt2, one_line_error

from dataflow import ShardWriter, TokenizerMeta
from dataflow.formats.manifest import read_manifest
from tools import repo_data


@functools.cache
def _megatron():
    """megatron-core's indexed dataset module, imported on first use (it takes ~10 s: not at collection)."""
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": CPU fallbacks, fine here
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def IndexedDataset(*args, **kwargs):  # noqa: N802 (megatron-core's class, looked up late)
    return _megatron().IndexedDataset(*args, **kwargs)


def IndexedDatasetBuilder(*args, **kwargs):  # noqa: N802
    return _megatron().IndexedDatasetBuilder(*args, **kwargs)

INT_DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16]


def megatron_documents(prefix: str) -> list[np.ndarray]:
    """Megatron's own view: document i is its sequences [di[i], di[i+1]) of IndexedDataset, end to end."""
    ds = IndexedDataset(prefix)
    di = ds.document_indices
    return [np.concatenate([np.zeros(0, ds.index.dtype)] + [ds[s] for s in range(di[i], di[i + 1])])
            for i in range(len(di) - 1)]


def build(prefix: str, docs: list[list[list[int]]], dtype=np.uint16, multimodal: bool = False) -> None:
    """A Megatron dataset made by megatron-core's builder: each document a list of sequences."""
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype, multimodal=multimodal)
    for doc in docs:
        for seq in doc:
            b.add_item(torch.tensor(seq, dtype=torch.int64))
        b.end_document()
    b.finalize(prefix + ".idx")


def random_docs(rng, n: int, high: int) -> list[list[list[int]]]:
    """Documents of 0-3 sequences (so some are empty) of 0-40 ids each."""
    return [[rng.integers(0, high, size=int(rng.integers(0, 40))).tolist() for _ in range(int(rng.integers(0, 4)))]
            for _ in range(n)]


def test_round_trip_of_real_gpt2_ids_through_megatron_core(tmp_path, capsys):
    ours = documents(kjv_gpt2())
    code, out, err = convert(capsys, "--to", "megatron", kjv_gpt2(), "-o", str(tmp_path / "kjv_text_document"))
    assert code == 0, err
    assert "1,189 documents" in out and "uint16" in out
    theirs = IndexedDataset(str(tmp_path / "kjv_text_document"))
    assert theirs.index.dtype == np.uint16 and len(theirs) == len(ours) == 1189  # one sequence per document
    assert theirs.document_indices.tolist() == list(range(1190))
    for (_, a), b in zip(ours, megatron_documents(str(tmp_path / "kjv_text_document"))):
        assert np.array_equal(a, b)  # the same ids, EOS included as stored: nothing added or dropped

    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "kjv_text_document"), "-o",
                           str(tmp_path / "back"), "--tokenizer", str(repo_data.gpt2_json()))
    assert code == 0, err
    back = documents(str(tmp_path / "back"))
    assert [i for i, _ in back] == [f"{tmp_path / 'kjv_text_document'}:{k}" for k in range(1189)]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(ours, back))
    m = read_manifest(str(tmp_path / "back"))
    assert m.tokenizer.vocab_size == 50257 and m.tokenizer.eos_id == 50256 and m.tokenizer.file == "tokenizer.json"
    assert main_decode(str(tmp_path / "back"), capsys) == main_decode(kjv_gpt2(), capsys)  # the same texts


def main_decode(dataset: str, capsys) -> list[str]:
    import json

    from dataflow.cli import main

    capsys.readouterr()
    assert main(["decode", dataset, "--no-progress"]) == 0
    return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda t: np.dtype(t).name)
def test_every_integer_dtype_megatron_defines_reads_as_its_documents(tmp_path, capsys, dtype):
    rng = np.random.default_rng(3)
    high = min(257, int(np.iinfo(dtype).max) + 1)
    docs = random_docs(rng, 300, high)
    build(str(tmp_path / "mg"), docs, dtype)
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "mg"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes", "--shard-size", "1KB")
    assert code == 0, err
    got = documents(str(tmp_path / "ds"))
    assert len(got) == 300 and len(read_manifest(str(tmp_path / "ds")).shards) > 1
    expected = megatron_documents(str(tmp_path / "mg"))
    for k, ((doc_id, tokens), want, seqs) in enumerate(zip(got, expected, docs)):
        assert doc_id == f"{tmp_path / 'mg'}:{k}"
        assert tokens.tolist() == want.tolist() == [t for s in seqs for t in s]


def test_small_batches_and_windows_give_the_same_dataset(tmp_path, capsys, monkeypatch):
    from dataflow.convert import common, megatron

    build(str(tmp_path / "mg"), random_docs(np.random.default_rng(5), 500, 257))
    convert(capsys, "--from", "megatron", str(tmp_path / "mg"), "-o", str(tmp_path / "a"), "--tokenizer", "bytes")
    monkeypatch.setattr(common, "BATCH_TOKENS", 7)
    monkeypatch.setattr("dataflow.convert.run.BATCH_TOKENS", 7)
    monkeypatch.setattr(megatron, "DOCS_PER_READ", 13)
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "mg"), "-o", str(tmp_path / "b"),
                           "--tokenizer", "bytes")
    assert code == 0, err
    for name in sorted(os.listdir(tmp_path / "a")):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    code, _, err = convert(capsys, "--to", "megatron", str(tmp_path / "b"), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert [d.tolist() for d in megatron_documents(str(tmp_path / "out"))] == \
        [d.tolist() for d in megatron_documents(str(tmp_path / "mg"))]


def test_several_prefixes_in_one_call_keep_their_order_and_ids(tmp_path, capsys):
    rng = np.random.default_rng(1)
    build(str(tmp_path / "b"), random_docs(rng, 7, 257), np.int32)
    build(str(tmp_path / "a"), random_docs(rng, 5, 257), np.uint8)
    code, out, err = convert(capsys, "--from", "megatron", str(tmp_path / "b.bin"), str(tmp_path / "a"), "-o",
                             str(tmp_path / "ds"), "--tokenizer", "bytes")
    assert code == 0 and "from 2 inputs" in out, err
    got = documents(str(tmp_path / "ds"))
    assert [i for i, _ in got] == [f"{tmp_path / 'b'}:{k}" for k in range(7)] + \
        [f"{tmp_path / 'a'}:{k}" for k in range(5)]
    want = megatron_documents(str(tmp_path / "b")) + megatron_documents(str(tmp_path / "a"))
    assert [t.tolist() for _, t in got] == [t.tolist() for t in want]


@pytest.mark.parametrize("vocab, dtype", [(65_499, np.uint16), (65_500, np.int32), (100_277, np.int32)])
def test_to_megatron_picks_megatrons_dtype_for_the_vocabulary(tmp_path, capsys, vocab, dtype):
    meta = TokenizerMeta(kind="bytes", name="big", vocab_size=vocab, eos_id=vocab - 1)
    rng = np.random.default_rng(vocab)
    docs = [rng.integers(0, vocab, size=int(rng.integers(0, 50))) for _ in range(40)]
    with ShardWriter(str(tmp_path / "ds"), tokenizer_meta=meta) as w:
        for d in docs:
            w.write(d)
    code, _, err = convert(capsys, "--to", "megatron", str(tmp_path / "ds"), "-o", str(tmp_path / "mg"))
    assert code == 0, err
    assert IndexedDataset(str(tmp_path / "mg")).index.dtype == dtype
    assert [d.tolist() for d in megatron_documents(str(tmp_path / "mg"))] == [d.tolist() for d in docs]


def test_reruns_are_byte_identical_and_need_overwrite(tmp_path, capsys):
    build(str(tmp_path / "mg"), random_docs(np.random.default_rng(2), 50, 257))
    args = ["--from", "megatron", str(tmp_path / "mg"), "--tokenizer", "bytes"]
    assert convert(capsys, *args, "-o", str(tmp_path / "one"))[0] == 0
    assert convert(capsys, *args, "-o", str(tmp_path / "two"))[0] == 0
    for name in os.listdir(tmp_path / "one"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    code, _, err = convert(capsys, *args, "-o", str(tmp_path / "one"))
    one_line_error(err, code, 2, str(tmp_path / "one"), "--overwrite")
    assert convert(capsys, *args, "-o", str(tmp_path / "one"), "--overwrite")[0] == 0

    to = ["--to", "megatron", str(tmp_path / "one"), "-o"]
    assert convert(capsys, *to, str(tmp_path / "x"))[0] == 0 and convert(capsys, *to, str(tmp_path / "y"))[0] == 0
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"x{ext}").read_bytes() == (tmp_path / f"y{ext}").read_bytes()
    code, _, err = convert(capsys, *to, str(tmp_path / "x"))
    one_line_error(err, code, 2, "x.bin", "--overwrite")
    assert convert(capsys, *to, str(tmp_path / "x"), "--overwrite")[0] == 0
    assert sorted(os.listdir(tmp_path)) == ["mg.bin", "mg.idx", "one", "two", "x.bin", "x.idx", "y.bin", "y.idx"]


def _rewrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


DAMAGE = {  # name: (edit of the files at prefix p, exit code, words the error names)
    "no idx": (lambda p: os.remove(p + ".idx"), 2, [".idx: no such file"]),
    "no bin": (lambda p: os.remove(p + ".bin"), 2, [".bin: no such file"]),
    "header": (lambda p: _rewrite(p + ".idx", 0, b"NOTANIDX!"), 1, ["not a Megatron index"]),
    "version": (lambda p: _rewrite(p + ".idx", 9, struct.pack("<Q", 2)), 1, ["version 2"]),
    "float64": (lambda p: _rewrite(p + ".idx", 17, struct.pack("<B", 6)), 1, ["float64", "not token ids"]),
    "float32": (lambda p: _rewrite(p + ".idx", 17, struct.pack("<B", 7)), 1, ["float32"]),
    "dtype code": (lambda p: _rewrite(p + ".idx", 17, struct.pack("<B", 42)), 1, ["unknown dtype code 42"]),
    "idx truncated": (lambda p: os.truncate(p + ".idx", os.path.getsize(p + ".idx") - 8), 1, ["truncated"]),
    "bin truncated": (lambda p: os.truncate(p + ".bin", os.path.getsize(p + ".bin") - 4), 1, [".bin", "truncated"]),
    "bin longer": (lambda p: _append(p + ".bin", b"\0\0"), 1, [".bin", "describes"]),
    "bin odd": (lambda p: _append(p + ".bin", b"\0"), 1, ["whole number"]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_missing_or_damaged_inputs_are_one_line_and_leave_no_output(tmp_path, capsys, damage):
    edit, expected, words = DAMAGE[damage]
    build(str(tmp_path / "mg"), [[[1, 2, 3], [4]], [[5, 6]], [[7]]])
    edit(str(tmp_path / "mg"))
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "mg"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes")
    one_line_error(err, code, expected, *words)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n in ("mg.bin", "mg.idx") if (tmp_path / n).exists())


def test_multimodal_index_is_refused(tmp_path, capsys):
    b = IndexedDatasetBuilder(str(tmp_path / "mm.bin"), dtype=np.uint16, multimodal=True)
    b.add_document(torch.tensor([1, 2, 3]), [2, 1], modes=[0, 1])
    b.add_document(torch.tensor([4]), [1], modes=[1])
    b.finalize(str(tmp_path / "mm.idx"))
    assert len(IndexedDataset(str(tmp_path / "mm"), multimodal=True)) == 3
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "mm"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes")
    one_line_error(err, code, 1, "multimodal")


def test_ids_beyond_the_vocabulary_or_negative_are_refused(tmp_path, capsys):
    build(str(tmp_path / "big"), [[[1, 2]], [[3]], [[4, 300, 5]]], np.uint16)
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "big"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes")
    one_line_error(err, code, 2, f"{tmp_path / 'big'}:2", "token id 300", "vocabulary size 257")
    build(str(tmp_path / "neg"), [[[1]], [[-3, 2]]], np.int8)
    code, _, err = convert(capsys, "--from", "megatron", str(tmp_path / "neg"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes")
    one_line_error(err, code, 1, f"{tmp_path / 'neg'}:1", "negative")
    assert not (tmp_path / "ds").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("argv, words", [
    (["--from", "megatron", "P", "-o", "D"], ["--from needs --tokenizer"]),
    (["--to", "megatron", "D", "-o", "P", "--tokenizer", "bytes"], ["drop --tokenizer"]),
    (["--to", "megatron", "D", "-o", "P", "--dtype", "uint16"], ["nanoGPT"]),
    (["--to", "megatron", "D", "-o", "P", "--shard-size", "1MB"], ["apply to --from"]),
    (["--from", "megatron", "P", "-o", "D", "--tokenizer", "no-such-tokenizer"], ["no-such-tokenizer"]),
    (["--to", "megatron", "s3://bucket/ds", "-o", "P"], ["local datasets"]),
])
def test_usage_mistakes_are_exit_2(tmp_path, capsys, monkeypatch, argv, words):
    build(str(tmp_path / "P"), [[[1]]])
    monkeypatch.chdir(tmp_path)
    code, _, err = convert(capsys, *argv)
    one_line_error(err, code, 2, *words)


def test_to_megatron_of_a_path_that_is_not_a_dataset_is_exit_2(tmp_path, capsys):
    code, _, err = convert(capsys, "--to", "megatron", str(tmp_path), "-o", str(tmp_path / "p"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
