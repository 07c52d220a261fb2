"""The tokenizer families users bring, id for id: GPT-2, Llama-3, Qwen2, Llama-2 and Mistral pipelines.

The test tokenizers (tests/data/tokenizers/, made by tools/make_test_tokenizers.py) are small vocabularies trained
on KJV inside each published tokenizer.json's pipeline. Every engine `--engine auto` may pick for a family is
forced in turn and must give the ids of `tokenizers` itself, the reference as tokenize defines it: special-token
strings inside text encoded as text, no BOS/EOS added, lone surrogates as U+FFFD. On KJV and on text meant to
break engines (scripts, emoji, digit runs, whitespace runs, code, the family's own special-token strings).
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
import sys

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer as HF

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents
from dataflow.tokenizers import gigatoken_engine, tiktoken_engine
from dataflow.tokenizers.flat import scrub
from dataflow.tokenizers.load import load_tokenizer
from support.reference import docs  # noqa: F401 (fixture)

FAMILIES = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizers"
PATHS = {"gpt2": GPT2_JSON, **{name: FAMILIES / name / "tokenizer.json"
                               for name in ("llama3", "qwen2", "llama2", "mistral")}}
BYTE_LEVEL = ("gpt2", "llama3", "qwen2")
SENTENCEPIECE = ("llama2", "mistral")
# what --engine auto picks; and with gigatoken unavailable (not installed, or its proof refused)
AUTO = {name: "gigatoken" for name in PATHS}
WITHOUT_GIGATOKEN = {"gpt2": "tiktoken", "llama3": "tiktoken", "qwen2": "tiktoken", "llama2": "hf", "mistral": "hf"}
ENGINES = {name: sorted({"hf", AUTO[name], WITHOUT_GIGATOKEN[name]}) for name in PATHS}


def added_tokens(name: str) -> list[str]:
    return [t["content"] for t in json.loads(PATHS[name].read_text(encoding="utf-8"))["added_tokens"]]


def adversarial(name: str) -> list[str]:
    """Texts that tell engines apart, with the family's own added and special tokens inside them as text."""
    specials = added_tokens(name)[:40]
    joined = "".join(specials)
    return [
        "", " ", "  ", "\n", "\t", "\r\n", "a", "\u2581", " \u2581 \u2581\u2581x",
        "Ünïcödé: café naïve Ångström ß ẞ ǅ ﬁ ﬀ Ⅻ ½ ² ℌ ℍ ﬃ", "e\u0301 a\u0308o\u0308 \u212b \u2126 \u1100\u1161\u11a8",
        "한국어 텍스트 \u1112\u1161\u11ab 中文文本，包含标点。日本語のテキスト、カタカナ ｶﾀｶﾅ ＡＢＣ",
        "😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ 🏳️‍🌈 😀😀😀a😀b \U0001f9d1\u200d\U0001f4bb",
        "Съешь же ещё этих мягких французских булок. Ελληνικά. العربية ١٢٣ עברית हिन्दी ภาษาไทย",
        "1234567890" * 8, "3.14159265358979 1,000,000 -42 0x1F 2024-01-31T12:30:00Z ٠١٢٣٤٥٦٧٨٩ ０１２３４",
        " " * 300, "\n" * 120, "\t" * 70, " \t\n" * 60, "\u3000" * 40, "\u00a0" * 33, "a" + " " * 257 + "b",
        "x \n \n\n  \n\t\n y  \r\n\r\n  z", "word" + "\u200b" * 5 + "word\ufeff\ufeffend",
        "def f(x):\n    return x ** 2  # square\n\n\tif a != b:\n\t\tpass\n",
        '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}\n<div class="x">&amp;</div>',
        "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n// comment\t\t\n",
        "I'm you're we've THEY'LL he'd IT'S 's 'S ''", "\x00\x01\x1b[31mred\x1b[0m\x7f",
        "\ue000\uf8ff \uffff \U0010fffd \U000e0001", "A" * 500, "ab" * 300, "!?" * 100, "AaBbCc" * 60,
        "<0x41><0x0A> <unk> <s>hello</s> [INST] x [/INST] <|endoftext|> <|begin_of_text|> <|im_start|>",
        joined, f"before{joined}after", " ".join(specials), "\n".join(specials) + "\n",
        "".join(f"{s}{s[:-1]}" for s in specials[:10]), "<|" * 40 + "|>" * 40,
        "lone \ud800 surrogate \udfff and \ud83d alone",
    ]


def reference(name: str, texts: list[str]) -> list[list[int]]:
    """`tokenizers` itself, as tokenize defines the reference (see hf_reference.load_reference)."""
    return _reference(name, tuple(texts))


@functools.lru_cache(maxsize=64)
def _reference(name: str, texts: tuple[str, ...]) -> list[list[int]]:
    ref = HF.from_file(str(PATHS[name]))
    ref.encode_special_tokens = True
    return [e.ids for e in ref.encode_batch([scrub(t) for t in texts], add_special_tokens=False)]


def first_difference(got: list[np.ndarray], want: list[list[int]], texts: list[str]) -> str | None:
    for i, (g, w) in enumerate(zip(got, want)):
        if g.tolist() != w:
            return f"text {i} {texts[i][:60]!r}: got {g.tolist()[:12]}, want {w[:12]}"
    return None if len(got) == len(want) else f"{len(got)} results for {len(want)} texts"


@pytest.fixture(scope="module")
def kjv_sample(docs) -> list[str]:  # noqa: F811
    return docs[::8]  # 149 chapters, 0.55 MB of text


@pytest.fixture()
def no_gigatoken(tmp_path, monkeypatch):
    """A machine where gigatoken cannot load (not installed): auto's next choice."""
    monkeypatch.setitem(sys.modules, "gigatoken", None)
    monkeypatch.setattr(gigatoken_engine, "_PROVEN", {})
    monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path / "proofs"))


def test_the_test_tokenizers_are_the_published_pipelines():
    """The pipeline options that make each family what it is, as the published files have them."""
    obj = {name: json.loads(PATHS[name].read_text(encoding="utf-8")) for name in PATHS}
    assert obj["llama3"]["model"]["ignore_merges"] and obj["llama3"]["normalizer"] is None
    assert obj["llama3"]["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].startswith("(?i:'s|'t|'re")
    assert obj["llama3"]["post_processor"]["processors"][1]["single"][0] == {
        "SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    assert len(obj["llama3"]["added_tokens"]) == 256 and all(t["special"] for t in obj["llama3"]["added_tokens"])
    assert obj["qwen2"]["normalizer"] == {"type": "NFC"} and "\\p{N}|" in json.dumps(obj["qwen2"]["pre_tokenizer"])
    assert {t["content"] for t in obj["qwen2"]["added_tokens"] if not t["special"]} >= {"<tool_call>", "<think>"}
    for name in SENTENCEPIECE:
        model = obj[name]["model"]
        assert model["byte_fallback"] and model["vocab"]["<0x00>"] == len(added_tokens(name))
        assert obj[name]["post_processor"]["single"][0] == {"SpecialToken": {"id": "<s>", "type_id": 0}}
    assert obj["llama2"]["normalizer"]["normalizers"][0] == {"type": "Prepend", "prepend": "\u2581"}
    assert obj["mistral"]["pre_tokenizer"] == {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                               "split": False}
    assert all(PATHS[name].stat().st_size < 1 << 20 for name in PATHS if name != "gpt2")


@pytest.mark.parametrize("name, engine", [(n, e) for n in PATHS for e in ENGINES[n]])
def test_every_engine_auto_may_pick_gives_the_reference_ids(name, engine, kjv_sample):
    tok = load_tokenizer(str(PATHS[name]), engine=engine)
    assert tok.engine == engine, tok.engine_reason
    for texts in (adversarial(name), kjv_sample):
        assert first_difference(tok.encode_batch(texts), reference(name, texts), texts) is None
    texts = adversarial(name)
    flat_values, offsets = tok.encode_flat(pa.array([scrub(t) for t in texts]))
    assert [flat_values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))] == reference(name, texts)


@pytest.mark.parametrize("name", list(PATHS))
def test_auto_picks_gigatoken_for_every_family(name):
    tok = load_tokenizer(str(PATHS[name]))
    assert tok.engine == AUTO[name] and "equivalence proven" in tok.engine_reason, tok.engine_reason


@pytest.mark.parametrize("name", list(PATHS))
def test_without_gigatoken_byte_level_runs_on_tiktoken_and_sentencepiece_says_it_falls_back_once(
        name, no_gigatoken, caplog):
    with caplog.at_level(logging.INFO, logger="dataflow.tokenizers"):
        tok = load_tokenizer(str(PATHS[name]))
    assert tok.engine == WITHOUT_GIGATOKEN[name], tok.engine_reason
    said = [r.getMessage() for r in caplog.records if r.name.startswith("dataflow.tokenizers")]
    assert len(said) == 1 and str(PATHS[name]) in said[0], said
    if name in SENTENCEPIECE:  # one line: tokenizers encodes, and why neither fast engine does
        assert "tokenizers encodes" in said[0] and "gigatoken is not installed" in said[0]
        assert "tiktoken: " in said[0] and "\n" not in said[0]
    texts = adversarial(name)
    assert first_difference(tok.encode_batch(texts), reference(name, texts), texts) is None


@pytest.mark.parametrize("name", list(PATHS))
def test_decode_gives_back_the_text(name, kjv_sample):
    tok = load_tokenizer(str(PATHS[name]))
    texts = kjv_sample[:20] + [t for t in adversarial(name) if "\ud800" not in t]
    ref = HF.from_file(str(PATHS[name]))
    for text, ids in zip(texts, tok.encode_batch(texts)):
        assert tok.decode(ids) == ref.decode(ids.tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("name", list(PATHS))
def test_dataflow_tokenize_gives_the_reference_ids_over_the_corpus(name, kjv, docs, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "ds"
    assert main(["tokenize", str(kjv), "-o", str(out), "--tokenizer", str(PATHS[name]), "--workers", "2",
                 "--shard-size", "1MB", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"engine {AUTO[name]}" in printed, printed
    manifest = read_manifest(str(out))
    eos = load_tokenizer(str(PATHS[name])).meta.eos_id
    assert manifest.tokenizer.eos_id == eos and manifest.tokenizer.vocab_size == len(HF.from_file(
        str(PATHS[name])).get_vocab(with_added_tokens=True))
    stored = [tokens.tolist() for _, tokens in iter_documents(str(out), manifest)]
    assert len(stored) == len(docs) == 1189
    want = reference(name, docs)
    prefix = list(load_tokenizer(str(PATHS[name])).template[0])  # the family's BOS (Llama-3, Llama-2, Mistral)
    bad = next((i for i, (s, w) in enumerate(zip(stored, want)) if s != prefix + w + [eos]), None)
    assert bad is None, f"document {bad}: stored {stored[bad][:12]}, reference {prefix} + {want[bad][:12]} + EOS {eos}"


def test_tiktoken_remembers_the_text_rules_with_its_proof(tmp_path, monkeypatch):
    """Qwen's NFC and its added tokens that are not special travel with the remembered proof: a second process
    on the machine, which skips the conversion, gives the same ids."""
    monkeypatch.setenv("DATAFLOW_PROOF_CACHE", str(tmp_path))
    texts = adversarial("qwen2")
    for cached in (False, True):
        monkeypatch.setattr(tiktoken_engine, "_PROVEN", {})  # a new process
        tok = load_tokenizer(str(PATHS["qwen2"]), engine="tiktoken")
        assert ("proof cached on this machine" in tok.engine_reason) == cached, tok.engine_reason
        assert "NFC normalization, 12 added tokens matched in text" in tok.engine_reason
        assert first_difference(tok.encode_batch(texts), reference("qwen2", texts), texts) is None
