"""Tokenizer files that lie are refused before any engine sees them, and a `.tiktoken` file is read as its encoding.

A `.tiktoken` file holds ranks only: its ranks must be exactly 0..n-1 (they are the ids), the published files
are recognised by sha256 and read with their encoding's split pattern, special tokens and EOS (taken from
tiktoken's own registry, or Meta's Llama 3 tokenizer), and any other file needs `--tiktoken-pattern`. A
`tokenizer.json` whose ids run far past its number of entries is refused (gigatoken would allocate per id).
Offline: the table of published hashes is extended in-process (`tiktoken_files.EXTRA_KNOWN_FILES`) with small
files made here from the first ranks of the shipped gpt2.tiktoken (itself r50k_base, recognised for real).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import pathlib
import re
import resource
import subprocess
import sys

import numpy as np
import pytest
import tiktoken
from tiktoken_ext import openai_public

from support.data import GPT2_JSON, GPT2_TIKTOKEN
from dataflow.cli import main
from dataflow.errors import ConfigError
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents
from dataflow.tokenizers import tiktoken_files
from dataflow.tokenizers.tiktoken_files import tiktoken_spec
from dataflow.tokenizers.load import load_tokenizer
from support.reference import LLAMA3_PATTERN
from support.tiktoken_files import TEXTS, GPT2_LINES, small_ranks, write_tiktoken, rank_lines, registry


@pytest.fixture()
def small(tmp_path) -> pathlib.Path:
    return write_tiktoken(tmp_path / "small.tiktoken", rank_lines(small_ranks()))


@pytest.fixture()
def src(tmp_path) -> pathlib.Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    return path


def tokenize(capsys, *args) -> tuple[int, str]:
    """`dataflow tokenize ARGS` in this process: (exit code, stderr)."""
    capsys.readouterr()
    rc = main(["tokenize", *map(str, args), "--no-progress", "--workers", "1"])
    return rc, capsys.readouterr().err


def refused(capsys, *args) -> str:
    rc, err = tokenize(capsys, *args)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("dataflow tokenize: error: "), (rc, err)
    return err


def stored_ids(out) -> list[list[int]]:
    return [tokens.tolist() for _, tokens in iter_documents(str(out), read_manifest(str(out)))]


# --- item 6: ranks that are not exactly 0..n-1 ---------------------------------------------------------

def _set(i: int, line: bytes):
    return lambda lines: lines[:i] + [line] + lines[i + 1:]


def _rank(i: int, rank: str):
    return lambda lines: lines[:i] + [lines[i].split()[0] + b" " + rank.encode()] + lines[i + 1:]


def _without_byte(lines: list[bytes]) -> list[bytes]:
    kept = lines[:100] + lines[101:]  # drop one single byte, renumber: the ranks are fine, a byte has none
    return [line.split()[0] + b" " + str(i).encode() for i, line in enumerate(kept)]


@pytest.mark.parametrize("edit, message", [
    (_rank(5, "70000"), "line 6: rank 70000 is not below the number of ranks (281; rank 5 is missing)"),
    (lambda lines: lines[:9] + lines[10:], "line 280: rank 280 is not below the number of ranks (280; rank 9 is "
                                           "missing)"),
    (_rank(19, "3"), "line 20: rank 3 is also the rank of line 4"),
    (_rank(6, "-1"), "line 7: rank -1 is negative"),
    (_set(7, b"!!!! 7"), "line 8 is not 'BASE64TOKEN RANK' (b'!!!! 7')"),
    (_set(8, b"IQ== 8 9"), "line 9 is not 'BASE64TOKEN RANK'"),
    (_set(9, b"IQ=="), "line 10 is not 'BASE64TOKEN RANK'"),
    (_rank(10, "+10"), "line 11 is not 'BASE64TOKEN RANK'"),
    (lambda lines: lines + [lines[0].split()[0] + b" 281"], "line 282: token b'!' is also on line 1"),
    (_without_byte, "byte 0xa7 has no rank"),
    (lambda lines: [], "empty .tiktoken file"),
])
def test_a_tiktoken_file_whose_ranks_lie_is_refused_in_one_line(tmp_path, capsys, src, edit, message):
    """Ranks are the ids: one past n was stored modulo 2^16 under a vocabulary of n + 1, and `verify` passed."""
    path = write_tiktoken(tmp_path / "lying.tiktoken", edit(rank_lines(small_ranks())))
    err = refused(capsys, src, "-o", tmp_path / "out", "--tokenizer", f"tiktoken:{path}")
    assert f"{path}: " in err and message in err
    with pytest.raises(ConfigError, match=re.escape(message)):  # with a split pattern given too
        load_tokenizer(tiktoken_spec(f"tiktoken:{path}", r"\S+|\s+"))


# --- item 6: a tokenizer.json whose ids run far past its entries ----------------------------------------

def _gpt2_json(tmp_path, edit) -> pathlib.Path:
    obj = json.loads(GPT2_JSON.read_text())
    edit(obj)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(obj))
    return path


def _vocab_id(obj):
    vocab = obj["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = 10**9


def _added_id(special: bool):
    def edit(obj):
        obj["added_tokens"].append({"id": 10**9, "content": "<|mine|>", "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": special})
    return edit


def _limited():  # a regression allocates 16 GB for the ids: let it fail fast here, not take the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("edit, what", [(_vocab_id, "vocabulary"), (_added_id(False), "added token")])
def test_a_vocabulary_id_of_a_billion_is_refused_before_any_engine_sees_it(tmp_path, src, edit, what):
    """It was an abort (exit 134): gigatoken tried to allocate 16 GB for the ids."""
    path = _gpt2_json(tmp_path, edit)
    p = subprocess.run([sys.executable, "-m", "dataflow.cli", "tokenize", str(src), "-o", str(tmp_path / "out"),
                        "--tokenizer", str(path), "--no-progress"], capture_output=True, text=True,
                       preexec_fn=_limited)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, (p.returncode, p.stderr[-2000:])
    assert f"{path}: its largest id is 1000000000 but it has 5025" in p.stderr and what in p.stderr


def test_sparse_ids_are_refused_by_every_engine_and_spec(tmp_path, capsys, src):
    special = _gpt2_json(tmp_path, _added_id(True))  # tokenizers itself ignores it: the file still lies
    with pytest.raises(ConfigError, match="its largest id is 1000000000 but it has 50258 ids"):
        load_tokenizer(str(special))
    vocab = _gpt2_json(tmp_path, _vocab_id)
    err = refused(capsys, src, "-o", tmp_path / "out", "--tokenizer", vocab, "--engine", "hf")
    assert "at most 2 ids per entry" in err


# --- item 6: no id is ever written modulo the token dtype ---------------------------------------------

@pytest.mark.parametrize("spec, engine", [(str(GPT2_JSON), "hf"), (f"tiktoken:{GPT2_TIKTOKEN}", "tiktoken")])
def test_ids_past_the_vocabulary_size_are_refused_not_wrapped(spec, engine):
    """The vocabulary size chooses the token dtype: an id at or past it would be stored modulo 2^16. Whatever makes
    the metadata claim fewer ids than the engine gives (a damaged cache of remembered metadata, a bug), the ids
    are checked where they are made."""
    tok = load_tokenizer(spec, engine)
    tok.meta = dataclasses.replace(tok.meta, vocab_size=2000, eos_id=1999)
    assert tok.encode_batch(["the"])[0].tolist() == [1169]  # ids below 2,000 pass
    with pytest.raises(ConfigError, match=r": the tokenizer gave id 31373, not below its vocabulary size 2000 "
                                          r"\(uint16 tokens\)"):
        tok.encode_batch(["In the beginning", "hello"])


# --- item 7: published files by sha256, with their encoding's pattern, special tokens and EOS -----------

def test_the_known_files_are_the_hashes_of_tiktokens_registry_and_llama_3():
    source = pathlib.Path(openai_public.__file__).read_text()
    hashes = {}
    for name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        body = re.search(rf"def {name}\(\):(.*?)\n\n\n", source, re.S).group(1)
        hashes[re.search(r'expected_hash="([0-9a-f]{64})"', body).group(1)] = name
    hashes["82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"] = "llama3"
    assert tiktoken_files.known_files() == hashes


def test_the_shipped_gpt2_tiktoken_is_r50k_base(tmp_path, capsys, src):
    assert hashlib.sha256(GPT2_TIKTOKEN.read_bytes()).hexdigest() in tiktoken_files.known_files()
    rc, err = tokenize(capsys, src, "-o", tmp_path / "out", "--tokenizer", f"tiktoken:{GPT2_TIKTOKEN}")
    assert rc == 0, err
    meta = read_manifest(str(tmp_path / "out")).tokenizer
    assert (meta.kind, meta.name, meta.vocab_size, meta.eos_id) == ("tiktoken", "r50k_base", 50257, 50256)
    r50k = registry("r50k_base", {base64.b64decode(t): int(r) for t, r in map(bytes.split, GPT2_LINES)})
    enc = tiktoken.Encoding("r50k", pat_str=r50k["pat_str"], mergeable_ranks=r50k["mergeable_ranks"],
                            special_tokens=r50k["special_tokens"])
    assert stored_ids(tmp_path / "out") == [enc.encode_ordinary(t) + [50256] for t in TEXTS]


def _expected(name: str, ranks: dict[bytes, int]) -> tuple[str, dict[str, int], str]:
    """(pattern, special tokens, EOS) of `name` from their sources: tiktoken's registry, Meta's tokenizer.py."""
    if name != "llama3":
        r = registry(name, ranks)
        return r["pat_str"], r["special_tokens"], "<|endoftext|>"
    names = (["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
             + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
             + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
    return LLAMA3_PATTERN, {t: len(ranks) + i for i, t in enumerate(names)}, "<|end_of_text|>"


@pytest.mark.parametrize("name, eos_id, vocab_size, splits_digits", [
    ("cl100k_base", 100257, 100277, True), ("o200k_base", 199999, 200019, True), ("p50k_base", 50256, 50257, False),
    ("llama3", 282, 537, True),
])
def test_a_published_file_gets_its_encodings_pattern_special_tokens_and_eos(small, monkeypatch, name, eos_id,
                                                                            vocab_size, splits_digits):
    monkeypatch.setattr(tiktoken_files, "EXTRA_KNOWN_FILES", {hashlib.sha256(small.read_bytes()).hexdigest(): name})
    tok = load_tokenizer(f"tiktoken:{small}")
    assert (tok.meta.name, tok.meta.eos_id, tok.meta.vocab_size) == (name, eos_id, vocab_size)
    assert f"is {name} by its sha256" in tok.engine_reason
    ranks = small_ranks()
    pattern, specials, eos = _expected(name, ranks)
    assert specials[eos] == eos_id
    enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    got = tok.encode_batch(TEXTS)
    assert [g.tolist() for g in got] == [enc.encode_ordinary(t) for t in TEXTS]
    gpt2 = tiktoken.Encoding("gpt2", pat_str=registry("r50k_base", ranks)["pat_str"], mergeable_ranks=ranks,
                             special_tokens={})
    # the digits: GPT-2's pattern (and p50k's, the same) keeps " 12345" whole
    assert (got[0].tolist() != gpt2.encode_ordinary(TEXTS[0])) == splits_digits
    assert tok.decode(np.append(got[1], eos_id)) == TEXTS[1]


def test_a_published_file_through_the_cli_records_its_encoding(tmp_path, capsys, src, small, monkeypatch):
    monkeypatch.setattr(tiktoken_files, "EXTRA_KNOWN_FILES",
                        {hashlib.sha256(small.read_bytes()).hexdigest(): "cl100k_base"})
    out = tmp_path / "out"
    rc, err = tokenize(capsys, src, "-o", out, "--tokenizer", f"tiktoken:{small}")
    assert rc == 0, err
    m = read_manifest(str(out))
    assert (m.tokenizer.name, m.tokenizer.eos_id, m.dtype) == ("cl100k_base", 100257, "uint32")
    r = registry("cl100k_base", small_ranks())
    enc = tiktoken.Encoding("c", pat_str=r["pat_str"], mergeable_ranks=small_ranks(), special_tokens={})
    assert stored_ids(out) == [enc.encode_ordinary(t) + [100257] for t in TEXTS]
    capsys.readouterr()
    assert main(["decode", str(out), "-o", str(tmp_path / "back.jsonl")]) == 0
    back = [json.loads(line)["text"] for line in (tmp_path / "back.jsonl").read_text().splitlines()]
    assert back == TEXTS


# --- item 7: any other file needs --tiktoken-pattern ---------------------------------------------------

def test_an_unknown_tiktoken_file_is_refused_without_a_split_pattern(tmp_path, capsys, src, small):
    err = refused(capsys, src, "-o", tmp_path / "out", "--tokenizer", f"tiktoken:{small}")
    sha = hashlib.sha256(small.read_bytes()).hexdigest()
    assert f"{small}: not a published .tiktoken file (sha256 {sha[:16]}" in err
    assert "pass its split pattern with --tiktoken-pattern" in err
    assert not (tmp_path / "out" / "index.json").exists()


def test_tiktoken_pattern_splits_an_unknown_file_and_is_recorded(tmp_path, capsys, src, small):
    out = tmp_path / "out"
    rc, err = tokenize(capsys, src, "-o", out, "--tokenizer", f"tiktoken:{small}", "--tiktoken-pattern",
                       LLAMA3_PATTERN)
    assert rc == 0, err
    m = read_manifest(str(out))
    n = len(small_ranks())
    assert (m.tokenizer.name, m.tokenizer.vocab_size, m.tokenizer.eos_id) == ("small.tiktoken", n + 1, n)
    tokenizer = m.provenance["settings"]["tokenizer"]  # the file (by path or content), then the pattern
    assert tokenizer.startswith("tiktoken:") and tokenizer.endswith(f"\0{LLAMA3_PATTERN}")
    enc = tiktoken.Encoding("s", pat_str=LLAMA3_PATTERN, mergeable_ranks=small_ranks(), special_tokens={})
    assert stored_ids(out) == [enc.encode_ordinary(t) + [n] for t in TEXTS]
    assert main(["decode", str(out), "-o", str(tmp_path / "back.jsonl")]) == 0  # decoding needs no pattern
    assert [json.loads(line)["text"] for line in (tmp_path / "back.jsonl").read_text().splitlines()] == TEXTS
    # a rerun with another pattern is another dataset
    rc, err = tokenize(capsys, src, "-o", out, "--tokenizer", f"tiktoken:{small}", "--tiktoken-pattern", r"\S+|\s+")
    assert rc == 2 and "tokenizer" in err


@pytest.mark.parametrize("tokenizer, pattern, message", [
    ("tiktoken:{small}", "(", "--tiktoken-pattern '(': tiktoken cannot use it"),
    ("tiktoken:{small}", r"\w+", "--tiktoken-pattern '\\\\w+' leaves text out: probe text"),
    ("tiktoken:{gpt2}", r"\S+|\s+", "is r50k_base by its sha256, which has its own split pattern; drop "
                                    "--tiktoken-pattern"),
    ("{json}", r"\S+|\s+", "--tiktoken-pattern applies to --tokenizer tiktoken:PATH"),
])
def test_a_pattern_that_cannot_work_is_refused_in_one_line(tmp_path, capsys, src, small, tokenizer, pattern,
                                                           message):
    spec = tokenizer.format(small=small, gpt2=GPT2_TIKTOKEN, json=GPT2_JSON)
    err = refused(capsys, src, "-o", tmp_path / "out", "--tokenizer", spec, "--tiktoken-pattern", pattern)
    assert message in err


def test_convert_names_an_unknown_tiktoken_file_as_tokenize_does(tmp_path, capsys, src, small):
    """convert encodes nothing, so it needs no split pattern; its manifest's tokenizer is tokenize's."""
    assert tokenize(capsys, src, "-o", tmp_path / "tok", "--tokenizer", f"tiktoken:{small}", "--tiktoken-pattern",
                    LLAMA3_PATTERN)[0] == 0
    ids = np.concatenate([np.array(d, dtype=np.uint16) for d in stored_ids(tmp_path / "tok")])
    ids.tofile(tmp_path / "ids.bin")
    capsys.readouterr()
    assert main(["convert", "--from", "nanogpt", str(tmp_path / "ids.bin"), "-o", str(tmp_path / "conv"),
                 "--tokenizer", f"tiktoken:{small}"]) == 0, capsys.readouterr().err
    tokenized = read_manifest(str(tmp_path / "tok")).tokenizer  # convert frames nothing: no framing recorded
    assert read_manifest(str(tmp_path / "conv")).tokenizer == dataclasses.replace(tokenized, framing=None)
