"""`dataflow convert --from/--to nanogpt`: nanoGPT's flat uint16 token file, read the way its train.py reads it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.convert import convert, documents, kjv_gpt2, one_line_error

from dataflow import ShardWriter, TokenizerMeta
from dataflow.formats.manifest import read_manifest
from tools import repo_data

GPT2 = str(repo_data.gpt2_json())


def test_to_nanogpt_equals_our_documents_end_to_end_and_reads_back(tmp_path, capsys):
    ours = documents(kjv_gpt2())
    code, out, err = convert(capsys, "--to", "nanogpt", kjv_gpt2(), "-o", str(tmp_path / "train.bin"))
    assert code == 0 and "uint16" in out, err
    flat = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")  # what nanoGPT's train.py does
    assert np.array_equal(flat, np.concatenate([t for _, t in ours]))

    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "train.bin"), "-o", str(tmp_path / "back"),
                           "--tokenizer", GPT2)
    assert code == 0, err
    back = documents(str(tmp_path / "back"))
    assert len(back) == len(ours) == 1189
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(ours, back))  # split after each EOS, EOS kept
    assert [i for i, _ in back[:2]] == [f"{tmp_path / 'train.bin'}:0", f"{tmp_path / 'train.bin'}:1"]
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "back"), "-o", str(tmp_path / "again.bin"))
    assert code == 0 and (tmp_path / "again.bin").read_bytes() == (tmp_path / "train.bin").read_bytes(), err


def test_from_a_file_made_the_way_nanogpts_prepare_py_makes_it(tmp_path, capsys):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(GPT2)
    tok.encode_special_tokens = True  # as prepare.py's encode_ordinary: "<|endoftext|>" in a text is text
    texts = ["First document.", "", "Third, with <|endoftext|> inside as text", "a trailing run without EOS"]
    ids = [tok.encode(t).ids + [50256] for t in texts[:3]] + [tok.encode(texts[3]).ids]
    np.array([i for d in ids for i in d], dtype=np.uint16).tofile(tmp_path / "val.bin")
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "val.bin"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", GPT2)
    assert code == 0, err
    got = documents(str(tmp_path / "ds"))
    assert [t.tolist() for _, t in got] == ids  # "<|endoftext|>" typed in a text is not an EOS id: no split there
    assert read_manifest(str(tmp_path / "ds")).tokenizer.eos_id == 50256


@pytest.mark.parametrize("flat, docs", [
    ([], []),
    ([9], [[9]]),
    ([9, 9, 9], [[9], [9], [9]]),
    ([1, 2], [[1, 2]]),
    ([1, 9, 2, 3, 9, 4], [[1, 9], [2, 3, 9], [4]]),
])
def test_splits_after_each_eos_and_keeps_a_trailing_run(tmp_path, capsys, monkeypatch, flat, docs):
    from dataflow.convert import nanogpt

    monkeypatch.setattr(nanogpt, "CHUNK_TOKENS", 2)  # documents across chunk boundaries
    np.array(flat, dtype=np.uint16).tofile(tmp_path / "f.bin")
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "f.bin"), "-o", str(tmp_path / "ds"),
                           "--tokenizer", "bytes", "--eos-id", "9")
    assert code == 0, err
    assert [t.tolist() for _, t in documents(str(tmp_path / "ds"))] == docs


def test_chunk_size_does_not_change_the_dataset(tmp_path, capsys, monkeypatch):
    from dataflow.convert import nanogpt

    rng = np.random.default_rng(0)
    rng.integers(0, 257, size=20_000).astype(np.uint16).tofile(tmp_path / "r.bin")
    args = ["--from", "nanogpt", str(tmp_path / "r.bin"), "--tokenizer", "bytes", "--shard-size", "4KB"]
    assert convert(capsys, *args, "-o", str(tmp_path / "a"))[0] == 0
    monkeypatch.setattr(nanogpt, "CHUNK_TOKENS", 333)
    assert convert(capsys, *args, "-o", str(tmp_path / "b"))[0] == 0
    names = sorted(os.listdir(tmp_path / "a"))
    assert len(names) > 3 and names == sorted(os.listdir(tmp_path / "b"))
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n


def test_several_files_in_one_call_and_uint32_named_for_it(tmp_path, capsys):
    np.array([1, 256, 2], dtype=np.uint16).tofile(tmp_path / "a.bin")
    np.array([3, 256], dtype=np.uint32).tofile(tmp_path / "b.uint32.bin")  # the name says uint32
    code, _, err = convert(capsys, "--from", "nanogpt", str(tmp_path / "a.bin"), str(tmp_path / "b.uint32.bin"),
                           "-o", str(tmp_path / "ds"), "--tokenizer", "bytes")
    assert code == 0, err
    got = documents(str(tmp_path / "ds"))
    assert [(i.rsplit("/", 1)[1], t.tolist()) for i, t in got] == \
        [("a.bin:0", [1, 256]), ("a.bin:1", [2]), ("b.uint32.bin:0", [3, 256])]


def _big_vocab_dataset(path, eos: bool = True) -> list[np.ndarray]:
    meta = TokenizerMeta(kind="bytes", name="big", vocab_size=100_277, eos_id=100_257)
    docs = [np.array([5, 70_000, 100_257]), np.array([100_276, 100_257])]
    with ShardWriter(str(path), tokenizer_meta=meta, provenance={"settings": {"eos": eos}}) as w:
        for d in docs:
            w.write(d if eos else d[:-1])
    return docs


def test_a_vocabulary_beyond_uint16_needs_uint32_asked_for_and_named(tmp_path, capsys):
    docs = _big_vocab_dataset(tmp_path / "ds")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", str(tmp_path / "train.bin"))
    one_line_error(err, code, 2, "100,277", "--dtype uint32")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", str(tmp_path / "train.bin"),
                           "--dtype", "uint32")
    one_line_error(err, code, 2, "train.bin", "name")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", str(tmp_path / "train.uint32.bin"),
                           "--dtype", "uint32")
    assert code == 0, err
    assert np.fromfile(tmp_path / "train.uint32.bin", dtype=np.uint32).tolist() == np.concatenate(docs).tolist()
    assert sorted(os.listdir(tmp_path)) == ["ds", "train.uint32.bin"]


def test_no_eos_dataset_needs_an_eos_id_to_separate_documents(tmp_path, capsys):
    docs = _big_vocab_dataset(tmp_path / "ds", eos=False)
    out = str(tmp_path / "t.uint32.bin")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", out, "--dtype", "uint32")
    one_line_error(err, code, 2, "--no-eos", "--eos-id")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "ds"), "-o", out, "--dtype", "uint32",
                           "--eos-id", "100257")
    assert code == 0, err
    assert np.fromfile(out, dtype=np.uint32).tolist() == np.concatenate(docs).tolist()
    code, _, err = convert(capsys, "--to", "nanogpt", kjv_gpt2(), "-o", str(tmp_path / "x.bin"), "--eos-id", "50256")
    one_line_error(err, code, 2, "already end with EOS", "drop --eos-id")


def test_real_no_eos_tokenize_output_and_a_writer_dataset_without_separators(tmp_path, capsys):
    code, _, err = convert(capsys, "--to", "nanogpt", kjv_gpt2(eos=False), "-o", str(tmp_path / "a.bin"))
    one_line_error(err, code, 2, "--no-eos")
    code, _, err = convert(capsys, "--to", "nanogpt", kjv_gpt2(eos=False), "-o", str(tmp_path / "a.bin"),
                           "--eos-id", "50256")
    assert code == 0, err
    with_eos = np.memmap(tmp_path / "a.bin", dtype=np.uint16, mode="r")
    assert np.array_equal(with_eos, np.concatenate([t for _, t in documents(kjv_gpt2())]))
    # a ShardWriter dataset says nothing about EOS: its documents are checked as they stream
    with ShardWriter(str(tmp_path / "w"), tokenizer_meta=TokenizerMeta("bytes", "bytes", 257, 256)) as w:
        w.write([1, 256], id="fine")
        w.write([2, 3], id="runs-on")
        w.write([4], id="last")
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "w"), "-o", str(tmp_path / "w.bin"))
    one_line_error(err, code, 2, "'runs-on'", "does not end with EOS 256")
    assert not (tmp_path / "w.bin").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_datasets_tokenized_with_and_without_eos_are_not_mixed(tmp_path, capsys):
    # --eos-id once went after every document of both: the EOS-ended ones got two (an empty document each)
    code, _, err = convert(capsys, "--to", "nanogpt", kjv_gpt2(), kjv_gpt2(eos=False), "-o", str(tmp_path / "m.bin"),
                           "--eos-id", "50256")
    one_line_error(err, code, 2, "tokenized differently", "with --no-eos", "convert them separately")
    assert not (tmp_path / "m.bin").exists()


def test_a_file_named_uint32_is_written_as_uint32_as_it_is_read_back(tmp_path, capsys):
    with ShardWriter(str(tmp_path / "w"), tokenizer_meta=TokenizerMeta("bytes", "bytes", 257, 256)) as w:
        for doc in ([10, 0, 11, 0, 256], [0, 12, 0, 256], [0]):
            w.write(doc)
    out = str(tmp_path / "t.uint32.bin")
    assert convert(capsys, "--to", "nanogpt", str(tmp_path / "w"), "-o", out)[0] == 0
    assert os.path.getsize(out) == 10 * 4
    assert convert(capsys, "--from", "nanogpt", out, "--tokenizer", "bytes", "-o", str(tmp_path / "back"))[0] == 0
    assert [t.tolist() for _, t in documents(str(tmp_path / "back"))] == [[10, 0, 11, 0, 256], [0, 12, 0, 256], [0]]
    code, _, err = convert(capsys, "--to", "nanogpt", str(tmp_path / "w"), "-o", str(tmp_path / "u.uint32.bin"),
                           "--dtype", "uint16")
    one_line_error(err, code, 2, "says uint32")


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.mark.parametrize("edit, argv, expected, words", [
    (lambda p: _append(p, b"\1"), [], 1, ["whole number of uint16"]),
    (lambda p: None, ["--dtype", "uint32"], 1, ["whole number of uint32"]),
    (lambda p: os.remove(p), [], 2, ["no such file"]),
    (lambda p: None, ["--eos-id", "257"], 2, ["--eos-id 257"]),
    (lambda p: np.array([1, 300], dtype=np.uint16).tofile(p), [], 2, [":0", "token id 300"]),
])
def test_bad_nanogpt_inputs_are_one_line(tmp_path, capsys, edit, argv, expected, words):
    path = str(tmp_path / "f.bin")
    np.array([1, 2, 256], dtype=np.uint16).tofile(path)
    edit(path)
    code, _, err = convert(capsys, "--from", "nanogpt", path, "-o", str(tmp_path / "ds"), "--tokenizer", "bytes",
                           *argv)
    one_line_error(err, code, expected, *words)
    assert not (tmp_path / "ds").exists()


def test_to_nanogpt_overwrite_and_byte_identical_reruns(tmp_path, capsys):
    args = ["--to", "nanogpt", kjv_gpt2(), "-o", str(tmp_path / "t.bin")]
    assert convert(capsys, *args)[0] == 0
    first = (tmp_path / "t.bin").read_bytes()
    code, _, err = convert(capsys, *args)
    one_line_error(err, code, 2, "t.bin exists", "--overwrite")
    assert convert(capsys, *args, "--overwrite")[0] == 0
    assert (tmp_path / "t.bin").read_bytes() == first
