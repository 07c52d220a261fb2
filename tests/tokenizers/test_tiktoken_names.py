"""`--tokenizer tiktoken:NAME`: OpenAI's encodings by name, from tiktoken's own cache, offline.

The cache is laid out as tiktoken lays it out (TIKTOKEN_CACHE_DIR, each file named by the sha1 of its URL); the
tests put files there themselves and never download: r50k_base is the shipped gpt2.tiktoken (the published
file), the others a small file of the test's own, known as that encoding through EXTRA_KNOWN_FILES.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import tiktoken
import zstandard

from support.data import GPT2_JSON, GPT2_TIKTOKEN
from dataflow.cli import main
from dataflow.errors import ConfigError
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents
from dataflow.tokenizers import tiktoken_files, tiktoken_names
from dataflow.tokenizers.load import load_tokenizer
from support.tiktoken_files import TEXTS, rank_lines, registry, small_ranks, write_tiktoken
from support.reference import reference_ids

URLS = {name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        for name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base")}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty tiktoken cache, this machine offline: a download attempt fails the test."""
    folder = tmp_path / "tiktoken-cache"
    folder.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tiktoken_names, "_download", lambda *a: pytest.fail("downloaded"))
    return folder


def cached(cache, name: str):
    """Where tiktoken itself looks for the file of `name` (tiktoken.load.read_file_cached)."""
    return cache / hashlib.sha1(URLS[name].encode()).hexdigest()


def test_the_cache_is_tiktokens_own(cache):
    for name, url in URLS.items():
        assert tiktoken_files.registry_file(name)[0] == url
    shutil.copy(GPT2_TIKTOKEN, cached(cache, "r50k_base"))
    from tiktoken.load import read_file_cached

    assert read_file_cached(URLS["r50k_base"], tiktoken_files.registry_file("r50k_base")[1]) == \
        GPT2_TIKTOKEN.read_bytes()  # tiktoken reads the very file, downloading nothing


def test_r50k_base_by_name_from_the_cache(cache):
    shutil.copy(GPT2_TIKTOKEN, cached(cache, "r50k_base"))
    tok = load_tokenizer("tiktoken:r50k_base")
    assert (tok.meta.kind, tok.meta.name, tok.meta.vocab_size, tok.meta.eos_id) == ("tiktoken", "r50k_base", 50257,
                                                                                     50256)
    assert tok.source == str(cached(cache, "r50k_base")) and "is r50k_base by its sha256" in tok.engine_reason
    text = ["In the beginning God created the heaven and the earth. <|endoftext|> 12345"]
    assert [a.tolist() for a in tok.encode_batch(text)] == reference_ids(GPT2_JSON, text)


@pytest.mark.parametrize("name", ["cl100k_base", "p50k_base", "o200k_base"])
def test_every_name_resolves_with_its_encodings_pattern(cache, tmp_path, monkeypatch, name):
    small = write_tiktoken(tmp_path / "small.tiktoken", rank_lines(small_ranks()))
    monkeypatch.setattr(tiktoken_files, "EXTRA_KNOWN_FILES", {hashlib.sha256(small.read_bytes()).hexdigest(): name})
    shutil.copy(small, cached(cache, name))
    tok = load_tokenizer(f"tiktoken:{name}")
    assert tok.meta.name == name
    r = registry(name, small_ranks())
    enc = tiktoken.Encoding(name, pat_str=r["pat_str"], mergeable_ranks=r["mergeable_ranks"],
                            special_tokens=r["special_tokens"])
    assert [a.tolist() for a in tok.encode_batch(TEXTS)] == [enc.encode_ordinary(t) for t in TEXTS]


def test_offline_without_the_file_is_one_line_saying_what_to_download_and_where(cache):
    with pytest.raises(ConfigError) as e:
        load_tokenizer("tiktoken:cl100k_base")
    msg = str(e.value)
    assert "\n" not in msg and "not in tiktoken's cache" in msg and "HF_HUB_OFFLINE" in msg
    assert f"download {URLS['cl100k_base']} and save it as {cached(cache, 'cl100k_base')}" in msg
    cached(cache, "r50k_base").write_bytes(b"aGVsbG8= 0\n")  # damaged: not the published file, and left alone
    with pytest.raises(ConfigError, match=r"r50k_base: .* is not the published file \(sha256 .*save it as"):
        load_tokenizer("tiktoken:r50k_base")
    assert cached(cache, "r50k_base").read_bytes() == b"aGVsbG8= 0\n"


def test_online_a_missing_file_is_downloaded_into_the_cache_once(cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetched = []
    monkeypatch.setattr(tiktoken_names, "_download", lambda name, url, todo: fetched.append(url)
                        or GPT2_TIKTOKEN.read_bytes())
    assert load_tokenizer("tiktoken:r50k_base").meta.name == "r50k_base"
    assert load_tokenizer("tiktoken:r50k_base").meta.name == "r50k_base"
    assert fetched == [URLS["r50k_base"]] and cached(cache, "r50k_base").read_bytes() == GPT2_TIKTOKEN.read_bytes()
    monkeypatch.setattr(tiktoken_names, "_download", lambda name, url, todo: b"aGVsbG8= 0\n")
    with pytest.raises(ConfigError, match=r"the download of .*cl100k_base.tiktoken is not the published file"):
        load_tokenizer("tiktoken:cl100k_base")
    assert not cached(cache, "cl100k_base").exists()


def test_a_file_of_that_name_is_still_a_file(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(GPT2_TIKTOKEN, tmp_path / "cl100k_base")
    tok = load_tokenizer("tiktoken:cl100k_base")  # the file here (GPT-2's ranks), not the encoding
    assert tok.meta.name == "r50k_base" and tok.source == "cl100k_base"


def test_dataflow_tokenize_with_a_named_encoding(cache, kjv, tmp_path, capsys):
    shutil.copy(GPT2_TIKTOKEN, cached(cache, "r50k_base"))
    out = tmp_path / "ds"
    assert main(["tokenize", str(kjv), "-o", str(out), "--tokenizer", "tiktoken:r50k_base", "--workers", "2",
                 "--no-progress"]) == 0
    manifest = read_manifest(str(out))
    assert (manifest.tokenizer.name, manifest.tokenizer.file) == ("r50k_base", "tokenizer.tiktoken")
    assert (out / "tokenizer.tiktoken").read_bytes() == GPT2_TIKTOKEN.read_bytes()  # a copy: decoding needs no cache
    first = [tokens.tolist() for _, tokens in iter_documents(str(out), manifest)][:50]
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()[:50]
    texts = [json.loads(line)["text"] for line in lines]
    assert first == [ids + [50256] for ids in reference_ids(GPT2_JSON, texts)]
    assert main(["tokenize", str(kjv), "-o", str(tmp_path / "bad"), "--tokenizer", "tiktoken:o200k_base",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "o200k_base.tiktoken and save it as" in err


def test_a_name_tiktoken_does_not_know_is_one_line_listing_the_names(cache):
    with pytest.raises(ConfigError, match=r"--tokenizer tiktoken:cl100k: no such file, and not one of tiktoken's "
                                          r"encodings \(r50k_base, p50k_base, cl100k_base, o200k_base\)"):
        load_tokenizer("tiktoken:cl100k")
