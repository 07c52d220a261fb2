"""The gigatoken engine: proven equal to `tokenizers` or refused with a reason, its memory bounded.

Real data: KJV, GPT-2's tokenizer.json, and tokenizers trained here on KJV: a SentencePiece-style BPE
with byte fallback (Llama-2/Mistral layout: `▁` for spaces, <0xNN> byte tokens) and a WordPiece model
gigatoken cannot run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer as HF
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from support.data import GPT2_JSON
from dataflow.errors import ConfigError
from dataflow.tokenizers import bpe_convert, gigatoken_engine, hf_reference
from dataflow.tokenizers.load import load_tokenizer
from support.reference import docs, gpt2_ref, reference_ids, same_ids  # noqa: F401 (fixtures)

PROBE = bpe_convert.probe_texts()


def train_sentencepiece_bpe(texts: list[str], path) -> str:
    """A Llama-2-style tokenizer.json (2,000 tokens) trained on `texts`: normalizer prepends `▁` and
    turns spaces into `▁`, no pre-tokenizer, BPE with byte fallback over <0x00>..<0xFF>."""
    tok = HF(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")  # words, for training only
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"],
                                                       show_progress=False))
    obj = json.loads(tok.to_str())
    obj["pre_tokenizer"] = None
    vocab = obj["model"]["vocab"]
    specials = ["<unk>", "<s>", "</s>"]
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(vocab, key=vocab.get)
                                                                  if t not in specials]
    obj["model"]["vocab"] = {t: i for i, t in enumerate(ordered)}
    for t in obj["added_tokens"]:
        t["id"] = obj["model"]["vocab"][t["content"]]
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


@pytest.fixture(scope="module")
def sp_bpe(docs, tmp_path_factory) -> str:  # noqa: F811
    return train_sentencepiece_bpe(docs[::4], tmp_path_factory.mktemp("sp") / "tokenizer.json")


@pytest.fixture()
def fresh_proofs(tmp_path, monkeypatch):
    """A machine and a process that have proven nothing yet."""
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path / "proofs"))
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    return tmp_path / "proofs"


def test_sentencepiece_bpe_with_byte_fallback_runs_on_gigatoken(docs, sp_bpe):  # noqa: F811
    tok = load_tokenizer(sp_bpe)
    assert tok.engine == "gigatoken", tok.engine_reason
    assert "SentencePiece-style BPE with byte fallback" in tok.engine_reason and "vocab tokens" in tok.engine_reason
    assert "tiktoken" not in tok.engine_reason  # gigatoken was first and proven: tiktoken was never tried
    some = docs[1::3] + PROBE + ["</s> inside a document stays text <s>", "emoji 😀 and ünïcode outside the vocab"]
    assert same_ids(tok.encode_batch(some), reference_ids(sp_bpe, some))
    with pytest.raises(ConfigError, match="--engine tiktoken cannot give.*normalizer"):
        load_tokenizer(sp_bpe, engine="tiktoken")


def test_a_model_gigatoken_cannot_run_falls_back_or_is_refused_in_one_line(tmp_path):
    tok = HF(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["In the beginning God created the heaven and the earth."] * 20,
                            trainers.WordPieceTrainer(vocab_size=100, special_tokens=["[UNK]", "[SEP]"],
                                                      show_progress=False))
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    auto = load_tokenizer(path)
    assert auto.engine == "hf" and "gigatoken: gigatoken cannot load it" in auto.engine_reason
    assert "WordPiece" in auto.engine_reason and "\n" not in auto.engine_reason
    with pytest.raises(ConfigError, match="--engine gigatoken cannot give this tokenizer's ids.*WordPiece") as e:
        load_tokenizer(path, engine="gigatoken")
    assert "\n" not in str(e.value)


def test_without_gigatoken_auto_falls_back_to_tiktoken_with_the_reason(fresh_proofs, monkeypatch):
    monkeypatch.setitem(sys.modules, "gigatoken", None)  # import gigatoken -> ImportError
    tok = load_tokenizer(str(GPT2_JSON))
    assert tok.engine == "tiktoken" and "gigatoken is not installed" in tok.engine_reason
    with pytest.raises(ConfigError, match="--engine gigatoken.*not installed"):
        load_tokenizer(str(GPT2_JSON), engine="gigatoken")


def test_a_gigatoken_proof_and_a_refusal_are_remembered_per_file_and_versions(fresh_proofs, sp_bpe, monkeypatch):
    first = load_tokenizer(str(GPT2_JSON))
    assert first.engine == "gigatoken" and "cached" not in first.engine_reason
    (record,) = [p for p in fresh_proofs.glob("*-gigatoken*-tokenizers*.json") if not p.name.endswith(".engine.json")]
    (engine_file,) = fresh_proofs.glob("*.engine.json")  # the JSON gigatoken loads, kept with the proof
    assert json.loads(engine_file.read_text())["model"]["type"] == "BPE"
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})  # a new process on the same machine

    def no_proof(expected, actual, texts, *args):
        assert not texts, "proved again although the proof was remembered"

    monkeypatch.setattr(bpe_convert, "first_mismatch", no_proof)
    monkeypatch.setattr(bpe_convert, "parse_tokenizer_json", lambda data: pytest.fail("parsed the JSON again"))
    second = load_tokenizer(str(GPT2_JSON), sample=[])
    assert second.engine == "gigatoken" and "proof cached on this machine" in second.engine_reason
    monkeypatch.undo()
    text = ["Hello <|endoftext|> world 1234"]
    assert same_ids(second.encode_batch(text), reference_ids(GPT2_JSON, text))
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(fresh_proofs))
    engine_file.write_text(engine_file.read_text()[:1000])  # a damaged copy is not loaded: the JSON is read again
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    assert load_tokenizer(str(GPT2_JSON), sample=[]).engine == "gigatoken"
    assert json.loads(engine_file.read_text())["model"]["type"] == "BPE"
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    record.write_text(json.dumps({"ok": False, "text": "probe text 3 differs"}))  # an earlier refusal
    refused = load_tokenizer(str(GPT2_JSON))
    assert refused.engine == "tiktoken" and "probe text 3 differs (remembered on this machine)" in refused.engine_reason


def test_a_remembered_proof_and_metadata_leave_tokenizers_unloaded_until_the_input_check(fresh_proofs, monkeypatch):
    """A run's workers start from the engine alone: `tokenizers` itself (0.3 s) loads for the input check."""
    first = load_tokenizer(str(GPT2_JSON))  # proves, and remembers the proof and the metadata
    loads = []
    real = hf_reference.load_reference
    monkeypatch.setattr(hf_reference, "load_reference", lambda *args: loads.append(args[0]) or real(*args))
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})  # a new process on the same machine
    second = load_tokenizer(str(GPT2_JSON))
    assert second.engine == "gigatoken" and second.meta == first.meta and loads == []
    second.check_sample(["In the beginning God created the heaven and the earth."])
    assert loads == [str(GPT2_JSON)] and second.meta == first.meta and "+ 1 sample texts" in second.engine_reason
    text = ["Hello <|endoftext|> world 1234"]
    assert same_ids(second.encode_batch(text), reference_ids(GPT2_JSON, text))
    assert second.decode(second.encode_batch(text)[0]) == text[0] and len(loads) == 1
    (record,) = fresh_proofs.glob("*.meta.json")
    record.write_text("{")  # damaged: not used, so the reference loads at once
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    assert load_tokenizer(str(GPT2_JSON)).meta == first.meta and len(loads) == 2


def test_wrong_remembered_metadata_is_corrected_by_the_input_check(fresh_proofs, monkeypatch, caplog):
    first = load_tokenizer(str(GPT2_JSON))
    (record,) = fresh_proofs.glob("*.meta.json")
    record.write_text(json.dumps({"vocab_size": 50257, "eos_id": 7}))
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    tok = load_tokenizer(str(GPT2_JSON))
    assert tok.meta.eos_id == 7  # believed until checked
    tok.check_sample([])  # even without input text to compare
    assert tok.meta == first.meta and "were wrong (50257, 7); using 50257, 50256" in caplog.text
    assert json.loads(record.read_text())["eos_id"] == 50256


def test_memory_bound_starts_afresh_and_keeps_the_ids(docs, gpt2_ref, fresh_proofs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gigatoken_engine, "CACHE_BUDGET_BYTES", -(1 << 40))  # every batch is past it
    monkeypatch.setattr(gigatoken_engine, "CACHE_BUDGET_TEXT", -1)
    tok = load_tokenizer(str(GPT2_JSON))
    assert tok.engine == "gigatoken"
    got = [a for i in range(0, 300, 20) for a in tok.encode_batch(docs[i:i + 20])]
    assert tok._fast.restarts >= 3  # every third batch: the first two after a start settle its buffers
    assert same_ids(got, gpt2_ref[:300])


def test_encode_flat_takes_arrow_slices_and_gives_flat_ids(docs, gpt2_ref):  # noqa: F811
    tok = load_tokenizer(str(GPT2_JSON))
    arr = pa.array(docs[:60], pa.string()).slice(10, 40)  # an offset into shared buffers, 32-bit offsets
    values, offsets = tok.encode_flat(arr)
    assert values.dtype == np.uint32 and offsets.dtype == np.int64 and len(offsets) == 41 and offsets[0] == 0
    assert [values[offsets[i]:offsets[i + 1]].tolist() for i in range(40)] == gpt2_ref[10:50]
    empty_values, empty_offsets = tok.encode_flat(pa.array([], pa.string()))
    assert empty_values.size == 0 and empty_offsets.tolist() == [0]


def test_memory_bound_keeps_a_cache_that_pays_and_drops_one_that_does_not(fresh_proofs, monkeypatch):
    """The engine starts afresh when the process grows past the budget, or past the floor while growing
    faster than the text it encodes (pieces that never repeat); slow growth below the budget keeps the cache."""
    tok = load_tokenizer(str(GPT2_JSON))
    engine = tok._fast
    rss = {"now": 1 << 30}
    monkeypatch.setattr(gigatoken_engine, "_rss_bytes", lambda: rss["now"])
    texts = pa.array(["x" * 1000] * 1000)  # 1 MB of text a call
    engine.encode_flat(texts)  # the first batches allocate what every batch needs: growth counts from the second
    rss["now"] += 45 << 20
    engine.encode_flat(texts)
    assert engine.restarts == 0
    rss["now"] += 30 << 20  # 30 MB in 1 MB of text: fast, but under the floor
    engine.encode_flat(texts)
    assert engine.restarts == 0
    rss["now"] += 20 << 20  # 50 MB in 2 MB: past the floor, 25 bytes a byte: drops the cache
    engine.encode_flat(texts)
    assert engine.restarts == 1
    base = rss["now"]
    for _ in range(60):  # 60 MB of text, 50 MB of growth: slower than the text, under the budget
        engine.encode_flat(texts)
    rss["now"] = base + (50 << 20)
    engine.encode_flat(texts)
    assert engine.restarts == 1
    rss["now"] = base + gigatoken_engine.CACHE_BUDGET_BYTES + 1  # past the budget: always
    engine.encode_flat(texts)
    assert engine.restarts == 2


def test_an_input_sample_checked_after_the_load_can_still_refuse_the_engine(fresh_proofs, monkeypatch):
    """The run loads and proves the tokenizer first (forked workers inherit it), then compares it on the input
    sample: a difference there chooses again, down the same order, and says why; asked for by name, it is one
    ConfigError line."""
    tok = load_tokenizer(str(GPT2_JSON))
    assert tok.engine == "gigatoken"
    tok.check_sample(["In the beginning God created the heaven and the earth."])
    assert tok.engine == "gigatoken" and "+ 1 sample texts" in tok.engine_reason

    wrong = lambda self, texts: [[0] for _ in texts]  # noqa: E731  (ids no tokenizer gives)
    monkeypatch.setattr(gigatoken_engine.GigatokenEngine, "lists", wrong)
    tok.check_sample(["a text the engine now gets wrong"])
    assert tok.engine in ("tiktoken", "hf") and "gigatoken" in tok.engine_reason and "input sample" in tok.engine_reason
    pinned = load_tokenizer(str(GPT2_JSON), "gigatoken")
    with pytest.raises(ConfigError, match="--engine gigatoken cannot give this tokenizer's ids"):
        pinned.check_sample(["a text the engine now gets wrong"])


def test_loading_imports_what_batches_need_only_for_the_processes_that_encode(fresh_proofs):
    """A process that loads a proven engine without encoding or checking with it (a finished run's rerun, a tool)
    imports neither awkward (gigatoken's ids, ~0.13 s; ~0.6 s uncompiled) nor pyarrow.compute; one about to
    fork its workers imports awkward once for all of them (`share_check_with_forks`). (A proof, or a check,
    imports it anyway: gigatoken's own encode_batch_list does.)"""
    load_tokenizer(str(GPT2_JSON))  # proven, and remembered
    code = ("import sys\nfrom dataflow.tokenizers.load import load_tokenizer\n"
            "tok = load_tokenizer(sys.argv[1])\nprint(tok.engine, 'awkward' in sys.modules, 'pyarrow.compute' in "
            "sys.modules)\ntok.share_check_with_forks()\nprint('awkward' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code, str(GPT2_JSON)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DATAFLOW_PROOF_CACHE": str(fresh_proofs)},
                       cwd=pathlib.Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["gigatoken", "False", "False", "True"], p.stdout


def test_a_file_remembered_here_skips_the_id_check_with_engine_hf_too(fresh_proofs, monkeypatch):
    """--engine hf, and decode (which loads a dataset's copy with it), skip `check_ids` (parsing the whole JSON,
    ~0.08 s) for a file this machine remembers, which passed it; the metadata is still compared."""
    first = load_tokenizer(str(GPT2_JSON))  # checked, and remembered
    checks = []
    real = hf_reference.check_ids
    monkeypatch.setattr(hf_reference, "check_ids", lambda *args: checks.append(args[1]) or real(*args))
    again = load_tokenizer(str(GPT2_JSON), "hf")
    assert again.engine == "hf" and again.meta == first.meta and checks == []
    (record,) = fresh_proofs.glob("*.meta.json")
    record.unlink()
    assert load_tokenizer(str(GPT2_JSON), "hf").meta == first.meta and checks == [str(GPT2_JSON)]
