"""Tokenizers: the fast engines (gigatoken, tiktoken) give exactly the ids of Hugging Face `tokenizers`, or are not used.

Real data only: the KJV corpus, GPT-2's tokenizer.json and gpt2.tiktoken, and byte-level BPEs trained
here on KJV with `tokenizers` (GPT-2-style and Llama-3-style pre-tokenizers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Regex
from tokenizers import Tokenizer as HF
from tokenizers import decoders, models, pre_tokenizers, trainers

from support.data import GPT2_JSON, GPT2_TIKTOKEN
from dataflow.errors import ConfigError
from dataflow.tokenizers import bpe_convert, choose, tiktoken_engine
from dataflow.tokenizers.load import load_tokenizer, tokenizer_for_dataset
from support.reference import LLAMA3_PATTERN, reference_ids, same_ids
from support.reference import docs, gpt2_ref  # noqa: F401  (fixtures)

PROBE = bpe_convert.probe_texts()


def _train(docs: list[str], path, style: str) -> str:
    """A byte-level BPE with a 2000-token vocab trained on a quarter of KJV (about a second)."""
    tok = HF(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # Llama-3 / Qwen style: the split regex first, then bytes without a second split
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs[::4], trainer)
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="session")
def kjv_bpe(docs, tmp_path_factory) -> str:
    return _train(docs, tmp_path_factory.mktemp("bpe") / "tokenizer.json", "gpt2")


@pytest.fixture(scope="session")
def kjv_llama3(docs, tmp_path_factory) -> str:
    return _train(docs, tmp_path_factory.mktemp("llama3") / "tokenizer.json", "llama3")


def variant(src: str, tmp_path, edit) -> str:
    """A copy of a tokenizer.json with `edit(obj)` applied."""
    obj = json.load(open(src))
    edit(obj)
    out = tmp_path / "tokenizer.json"
    out.write_text(json.dumps(obj))
    return str(out)


# --- the tiktoken engine, proven equal ----------------------------------------------------------

def test_gpt2_auto_picks_gigatoken_and_matches_hf_on_all_kjv(docs, gpt2_ref):
    tok = load_tokenizer(str(GPT2_JSON))
    assert tok.engine == "gigatoken", tok.engine_reason
    assert tok.engine_reason.startswith("gigatoken:") and "probe" in tok.engine_reason
    assert (tok.meta.kind, tok.meta.vocab_size, tok.meta.eos_id, tok.meta.dtype) == ("hf", 50257, 50256, "uint16")
    got = tok.encode_batch(docs)
    assert all(g.dtype == np.uint32 for g in got)
    assert same_ids(got, gpt2_ref)


def test_gpt2_forced_tiktoken_matches_hf_on_all_kjv(docs, gpt2_ref):
    tok = load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    assert tok.engine == "tiktoken" and tok.engine_reason.startswith("tiktoken:"), tok.engine_reason
    assert same_ids(tok.encode_batch(docs), gpt2_ref)


def test_gpt2_probe_and_decode_round_trip(docs):
    tok = load_tokenizer(str(GPT2_JSON))
    assert same_ids(tok.encode_batch(PROBE), reference_ids(GPT2_JSON, PROBE))
    for text, ids in zip(PROBE + docs[:50], tok.encode_batch(PROBE + docs[:50])):
        assert tok.decode(ids) == text
        assert tok.decode(np.append(ids, tok.meta.eos_id)) == text  # EOS dropped


def test_kjv_trained_bpe_converts_and_matches(docs, kjv_bpe):
    assert load_tokenizer(kjv_bpe).engine == "gigatoken"
    tok = load_tokenizer(kjv_bpe, engine="tiktoken")
    assert tok.engine == "tiktoken", tok.engine_reason
    assert "vocab tokens" in tok.engine_reason  # ignore_merges off: every token rebuilt by BPE, checked
    assert tok.meta.vocab_size == 2000 and tok.meta.eos_id == 0
    some = docs[1::3]  # a third of KJV, mostly unseen in training: the small-vocab reference is slow
    got = tok.encode_batch(some)
    assert same_ids(got, reference_ids(kjv_bpe, some))
    assert all(tok.decode(ids) == text for text, ids in zip(some, got))
    probe = tok.encode_batch(PROBE)
    assert same_ids(probe, reference_ids(kjv_bpe, PROBE))
    assert all(tok.decode(ids) == text for text, ids in zip(PROBE, probe))


def test_llama3_style_split_regex_with_ignore_merges_converts(docs, kjv_llama3):
    for engine in ("auto", "tiktoken"):
        tok = load_tokenizer(kjv_llama3, engine=engine)
        assert tok.engine == ("gigatoken" if engine == "auto" else "tiktoken"), tok.engine_reason
        assert engine == "auto" or "Split" in tok.engine_reason
        assert same_ids(tok.encode_batch(docs[2::3]), reference_ids(kjv_llama3, docs[2::3]))
        assert same_ids(tok.encode_batch(PROBE), reference_ids(kjv_llama3, PROBE))


def test_vocab_tokens_without_a_merge(kjv_llama3, kjv_bpe, tmp_path):
    """With ignore_merges, tokenizers emits such a token for a whole piece, as tiktoken does; without,
    never. One that splits into two ranked tokens cannot be converted: tiktoken would merge into it."""
    def add(token):
        return lambda o: o["model"]["vocab"].update({token: 2000})
    text = ["qzqzqz", "a qzqzqz b qzqzqzq", "Qzqzqz"]
    whole = variant(kjv_llama3, tmp_path, add("qzqzqz"))
    tok = load_tokenizer(whole, engine="tiktoken")
    assert tok.engine == "tiktoken", tok.engine_reason
    assert same_ids(tok.encode_batch(text), reference_ids(whole, text)) and tok.encode_batch(text)[0].tolist() == [2000]
    (tmp_path / "b").mkdir()
    unreachable = variant(kjv_bpe, tmp_path / "b", add("qzqzqz"))
    tok = load_tokenizer(unreachable, engine="tiktoken")
    assert tok.engine == "tiktoken" and "1 vocab tokens no merge can make left out" in tok.engine_reason
    assert same_ids(tok.encode_batch(text), reference_ids(unreachable, text))
    (tmp_path / "c").mkdir()
    splittable = variant(kjv_llama3, tmp_path / "c", add("LORDGod"))
    with pytest.raises(ConfigError, match="has no merge rule but splits into two ranked tokens"):
        load_tokenizer(splittable, engine="tiktoken")
    for path in (whole, unreachable, splittable):
        assert same_ids(load_tokenizer(path).encode_batch(text), reference_ids(path, text))


def test_endoftext_inside_a_document_is_text_not_eos():
    text = "The end.<|endoftext|>The start. <|endoftext|>"
    for tok in (load_tokenizer(str(GPT2_JSON)), load_tokenizer(str(GPT2_JSON), engine="hf"),
                load_tokenizer(str(GPT2_JSON), engine="tiktoken"), load_tokenizer(f"tiktoken:{GPT2_TIKTOKEN}")):
        ids = tok.encode_batch([text])[0]
        assert 50256 not in ids.tolist(), tok.engine
        assert ids.tolist() == reference_ids(GPT2_JSON, [text])[0]
        assert tok.decode(ids) == text


def test_tiktoken_file_spec_matches_hf(docs, gpt2_ref):
    tok = load_tokenizer(f"tiktoken:{GPT2_TIKTOKEN}")
    assert tok.engine == "tiktoken" and "is r50k_base by its sha256" in tok.engine_reason
    assert (tok.meta.kind, tok.meta.vocab_size, tok.meta.eos_id) == ("tiktoken", 50257, 50256)
    got = tok.encode_batch(docs)
    assert same_ids(got, gpt2_ref)
    assert tok.decode(got[0]) == docs[0]


def test_bytes_round_trip(docs):
    tok = load_tokenizer("bytes")
    assert tok.engine == "bytes" and tok.engine_reason
    for text, ids in zip(docs + PROBE, tok.encode_batch(docs + PROBE)):
        assert ids.tolist() == list(text.encode("utf-8"))
        assert tok.decode(np.append(ids.astype(np.uint32), 256)) == text


def test_threads_give_the_same_ids(docs, gpt2_ref):
    for engine in ("gigatoken", "tiktoken"):
        tok = load_tokenizer(str(GPT2_JSON), engine=engine, threads=2)
        assert tok.threads == 2 and tok.engine == engine
        assert same_ids(tok.encode_batch(docs[:200]), gpt2_ref[:200])


def test_hf_threads_in_a_fresh_process(kjv_bpe):
    """rayon sizes its pool once per process, so the multi-thread tokenizers path runs in its own."""
    code = ("import os, sys; from dataflow.tokenizers.load import load_tokenizer; "
            "t = load_tokenizer(sys.argv[1], engine='hf', threads=2); "
            "print(os.environ['RAYON_NUM_THREADS'], t.encode_batch(['In the beginning'] * 8)[7].tolist())")
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    out = subprocess.run([sys.executable, "-c", code, kjv_bpe], capture_output=True, text=True, env=env, check=True)
    threads, ids = out.stdout.split(" ", 1)
    assert threads == "2" and json.loads(ids) == reference_ids(kjv_bpe, ["In the beginning"])[0]


def test_probe_covers_bytes_whitespace_scripts_and_emoji():
    seen = set()
    for t in PROBE:
        seen.update(t.encode("utf-8"))
    assert seen == set(range(256)) - {0xC0, 0xC1} - set(range(0xF5, 0x100))  # every byte UTF-8 can hold
    joined = "".join(PROBE)
    for needle in ("  ", "\n\n\n", "\r\n", "\t\t", "123456789", "中文", "العربية", "😀", "👨‍👩‍👧‍👦", "\u3000",
                   "a" * 64, "<|endoftext|>"):
        assert needle in joined, needle


# --- fallbacks: a reason, the right ids, and an error when tiktoken is demanded -----------------

def test_normalizer_falls_back_to_hf_and_tiktoken_engine_is_an_error(docs, kjv_bpe, tmp_path):
    path = variant(kjv_bpe, tmp_path, lambda o: o.update(normalizer={"type": "NFKC"}))
    tok = load_tokenizer(path)
    assert tok.engine in ("hf", "gigatoken") and "tiktoken: " in tok.engine_reason
    assert "normalizer NFKC" in tok.engine_reason
    text = ["ﬁne ① Ａ"] + docs[:20]  # NFKC changes the first one
    assert same_ids(tok.encode_batch(text), reference_ids(path, text))
    with pytest.raises(ConfigError, match=r"tokenizer\.json.*--engine tiktoken.*normalizer NFKC"):
        load_tokenizer(path, engine="tiktoken")


def _swap_merges(o):
    m = o["model"]["merges"]
    m[10], m[500] = m[500], m[10]


def _split_with_gaps(o):  # tokenizers keeps unmatched text as pieces, tiktoken would drop it
    o["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r" ?\p{L}+| ?\p{N}+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


@pytest.mark.parametrize("edit, reason", [
    (lambda o: o["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
    (lambda o: o["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda o: o["model"].update(dropout=0.1), "dropout"),
    (lambda o: o["added_tokens"].append({"id": 2000, "content": "LORD", "single_word": False, "lstrip": False,
                                         "rstrip": False, "normalized": False, "special": False}), "not special"),
    (lambda o: o["pre_tokenizer"].update(use_regex=False), "use_regex=false"),
    (lambda o: o.update(pre_tokenizer={"type": "Whitespace"}), "not ByteLevel"),
    (_swap_merges, "merges disagree with rank order at merge 11"),
    (_split_with_gaps, "probe text"),
])
def test_unconvertible_tokenizers_fall_back_with_a_reason(kjv_bpe, tmp_path, edit, reason):
    path = variant(kjv_bpe, tmp_path, edit)
    tok = load_tokenizer(path)  # gigatoken may prove itself where tiktoken cannot; the ids are right either way
    assert tok.engine in ("hf", "gigatoken") and (tok.engine == "gigatoken" or reason in tok.engine_reason)
    text = ["And God said, Let there be light: and there was light. 1234"]
    if reason != "dropout":  # dropout: random ids, from tokenizers as from the reference
        assert same_ids(tok.encode_batch(text), reference_ids(path, text))
    with pytest.raises(ConfigError, match=reason.split(" ")[0]):
        load_tokenizer(path, engine="tiktoken")


def test_input_sample_is_checked_at_load_and_on_first_batch(kjv_bpe, tmp_path, monkeypatch):
    """A difference only real input shows (the probe disabled here) still sends the work to tokenizers."""
    monkeypatch.setattr(bpe_convert, "probe_texts", lambda extra=(): [])
    monkeypatch.setattr(bpe_convert, "vocab_texts", lambda ranks: [])
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    monkeypatch.setattr(choose, "FAST_ENGINES", ("tiktoken",))
    path = variant(kjv_bpe, tmp_path, _split_with_gaps)
    text = ["Let there be light: and there was light."]  # ':' and '.' fall between the regex's matches
    want = reference_ids(path, text)

    tok = load_tokenizer(path, sample=text)
    assert tok.engine == "hf" and "input sample" in tok.engine_reason

    tok = load_tokenizer(path)  # proven on the (empty) probe only: tiktoken until the first batch shows otherwise
    assert tok.engine == "tiktoken"
    assert same_ids(tok.encode_batch(text), want)
    assert tok.engine == "hf" and tok.engine_reason.startswith("hf: input text 0 differs")

    tok = load_tokenizer(path, engine="tiktoken")
    with pytest.raises(ConfigError, match="--engine tiktoken gives other ids"):
        tok.encode_batch(text)


def test_the_engine_is_chosen_before_the_first_ids_and_never_changes_after(kjv_bpe, tmp_path, monkeypatch):
    """The engine is chosen up front (choose.py), on the probe, the sample and this process's first batch, before
    any of its ids leave: once the tokenizer has given ids, a text the engine gets wrong stops the work with one
    line instead of switching engines in the middle (which mixed two engines' ids in one dataset)."""
    monkeypatch.setattr(bpe_convert, "probe_texts", lambda extra=(): [])
    monkeypatch.setattr(bpe_convert, "vocab_texts", lambda ranks: [])
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    monkeypatch.setattr(choose, "FAST_ENGINES", ("tiktoken",))
    path = variant(kjv_bpe, tmp_path, _split_with_gaps)
    fine = ["In the beginning God created the heaven and the earth"]  # every character inside a regex match
    wrong = ["Let there be light: and there was light."]  # ':' and '.' fall between the regex's matches

    tok = load_tokenizer(path)
    assert same_ids(tok.encode_batch(fine), reference_ids(path, fine)) and tok.engine == "tiktoken"
    with pytest.raises(ConfigError, match="tiktoken, chosen for this tokenizer and used since, gives other ids.*"
                                          "input text 0 differs.*--engine hf"):
        tok.encode_batch(wrong)
    with pytest.raises(ConfigError, match="used since"):
        tok.check_sample(wrong)
    assert tok.engine == "tiktoken" and same_ids(tok.encode_batch(fine), reference_ids(path, fine))

    chosen = load_tokenizer(path, sample=wrong)  # the same text, known before the first ids: tokenizers encodes
    for batch in (fine, wrong, fine + wrong):
        assert same_ids(chosen.encode_batch(batch), reference_ids(path, batch)) and chosen.engine == "hf"


def test_forced_hf_engine(kjv_bpe):
    tok = load_tokenizer(kjv_bpe, engine="hf")
    assert tok.engine == "hf" and "--engine hf" in tok.engine_reason


def test_vocab_size_is_max_id_plus_one(docs, kjv_bpe, tmp_path):
    def sparse(o):  # move the last merge's token to id 70000: 2000 tokens, ids up to 70000
        vocab = o["model"]["vocab"]
        last = max(vocab, key=vocab.get)
        vocab[last] = 70000
    path = variant(kjv_bpe, tmp_path, sparse)
    for engine in ("auto", "tiktoken"):
        tok = load_tokenizer(path, engine=engine)
        assert tok.meta.vocab_size == 70001 and tok.meta.dtype == "uint32"
        assert tok.engine != "hf", tok.engine_reason
        assert same_ids(tok.encode_batch(docs[:100]), reference_ids(path, docs[:100]))


def test_lone_surrogates_encode_as_replacement_character_in_every_engine():
    text = ["bad \ud800 text"]
    want = reference_ids(GPT2_JSON, ["bad \ufffd text"])
    for engine in ("auto", "hf", "gigatoken", "tiktoken"):
        assert same_ids(load_tokenizer(str(GPT2_JSON), engine=engine).encode_batch(text), want)
    assert load_tokenizer("bytes").encode_batch(text)[0].tobytes() == "bad \ufffd text".encode()


def test_dataset_copy_is_enough_to_decode(kjv_bpe, tmp_path):
    tok = load_tokenizer(kjv_bpe)
    meta = tok.copy_into(str(tmp_path))
    assert meta.file == "tokenizer.json" and (tmp_path / "tokenizer.json").read_bytes() == open(kjv_bpe, "rb").read()
    again = tokenizer_for_dataset(str(tmp_path), meta)
    ids = tok.encode_batch(["In the beginning God created the heaven and the earth."])[0]
    assert again.decode(ids) == "In the beginning God created the heaven and the earth."
    tt = load_tokenizer(f"tiktoken:{GPT2_TIKTOKEN}")
    meta = tt.copy_into(str(tmp_path))
    assert tokenizer_for_dataset(str(tmp_path), meta).decode(tt.encode_batch(["Amen."])[0]) == "Amen."


@pytest.mark.parametrize("spec, engine, match", [
    ("/nonexistent/tokenizer.json", "auto", "not found: /nonexistent/tokenizer.json"),
    ("bytes", "fast", "unknown engine 'fast'"),
    ("bytes", "tiktoken", "bytes tokenizer"),
    ("bytes", "gigatoken", "bytes tokenizer"),
    (f"tiktoken:{GPT2_TIKTOKEN}", "hf", "gpt2.tiktoken: a .tiktoken file runs only on tiktoken"),
    (f"tiktoken:{GPT2_JSON}", "auto", "tokenizer.json: not a valid .tiktoken file"),
])
def test_user_mistakes_are_config_errors(spec, engine, match):
    with pytest.raises(ConfigError, match=match):
        load_tokenizer(spec, engine)


def test_bad_json_and_bad_threads_are_config_errors(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": ')
    with pytest.raises(ConfigError, match="tokenizer.json: not a valid Hugging Face tokenizer.json"):
        load_tokenizer(str(bad))
    with pytest.raises(ConfigError, match="threads"):
        load_tokenizer("bytes", threads=0)


def test_a_proof_is_remembered_per_file_and_engine_versions(tmp_path, monkeypatch):
    import dataflow.tokenizers.load as toks

    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path))
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    first = toks.load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    assert first.engine == "tiktoken" and "cached" not in first.engine_reason
    assert len(list(tmp_path.glob("*-conv*.json"))) == 1 and len(list(tmp_path.glob("*.meta.json"))) == 1
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})  # a new process on the same machine
    second = toks.load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    assert second.engine == "tiktoken" and "proof cached on this machine" in second.engine_reason
    text = "Hello <|endoftext|> world 1234"
    assert [a.tolist() for a in second.encode_batch([text])] == [a.tolist() for a in first.encode_batch([text])]


def test_remembered_ranks_skip_the_conversion_and_a_damaged_record_is_ignored(tmp_path, monkeypatch):
    import dataflow.tokenizers.load as toks

    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path))
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    first = toks.load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    text = ["Hello <|endoftext|> world 1234", "  spaces\tand\nnewlines ünïcödé 🙂"]
    want = [a.tolist() for a in first.encode_batch(text)]

    def no_conversion(obj):
        raise AssertionError("converted again although the ranks were remembered")

    monkeypatch.setattr(bpe_convert, "convert", no_conversion)
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    second = toks.load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    assert second.engine == "tiktoken" and [a.tolist() for a in second.encode_batch(text)] == want

    monkeypatch.undo()
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path))
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    (record,) = tmp_path.glob("*-conv*.json")
    record.write_text(record.read_text()[:1000])  # cut short: not JSON any more
    third = toks.load_tokenizer(str(GPT2_JSON), engine="tiktoken")
    assert third.engine == "tiktoken" and "cached" not in third.engine_reason
    assert [a.tolist() for a in third.encode_batch(text)] == want
