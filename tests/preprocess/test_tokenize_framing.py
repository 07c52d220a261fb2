"""BOS and EOS said, not assumed (issue 34 item 2): documents framed as the tokenizer's post-processor frames a
single sequence, plus the EOS the toolkit appends; --bos/--no-bos, --eos/--no-eos, --bos-token, --eos-token;
--special-tokens text|parse; the framing in the manifest, `inspect`, `decode` and the loader; a rerun with another
framing refused; manifests of before still read. Through the CLI and the public API, on the shipped family
tokenizers (tests/data/tokenizers/) and GPT-2."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from tokenizers import Tokenizer as HF

from support.data import GPT2_JSON
from dataflow.cli import main
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents
from dataflow.loading.dataset import StreamingDataset

FAMILIES = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizers"
PATHS = {"gpt2": GPT2_JSON, **{name: FAMILIES / name / "tokenizer.json"
                               for name in ("llama3", "qwen2", "llama2", "mistral")}}
BOS = {"gpt2": None, "qwen2": None, "llama3": "<|begin_of_text|>", "llama2": "<s>", "mistral": "<s>"}
EOS = {"gpt2": "<|endoftext|>", "qwen2": "<|endoftext|>", "llama3": "<|end_of_text|>", "llama2": "</s>",
       "mistral": "</s>"}
TEXTS = ["In the beginning God created the heaven and the earth.",
         "And the earth was without form, and void; and darkness was upon the face of the deep.",
         "code:\n\tdef f(x):\n\t\treturn x ** 2  # 1234567890\n", "Ünïcödé café 中文 😀 🇫🇷", "  spaces   and\n\nlines  "]
SPECIAL_TEXTS = ["a <|endoftext|> b", "<|begin_of_text|>start", "end<|end_of_text|>", "<s>hello</s> [INST] x [/INST]",
                 "<|im_start|>user\nhi<|im_end|>", "no special token here", "<|eot_id|><|eot_id|>", ""]


def hf(name: str, parse: bool = False) -> HF:
    tok = HF.from_file(str(PATHS[name]))
    tok.encode_special_tokens = not parse
    return tok


def write_jsonl(path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"d{i}", "text": t}) + "\n")
    return path


def tokenize(tmp_path, texts, tokenizer, *flags, out="ds") -> tuple[int, pathlib.Path]:
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    dest = tmp_path / out
    rc = main(["tokenize", str(src), "-o", str(dest), "--tokenizer", str(tokenizer), "--workers", "1",
               "--no-progress", *flags])
    return rc, dest


def stored(dest: pathlib.Path) -> list[list[int]]:
    return [t.tolist() for _, t in iter_documents(str(dest), read_manifest(str(dest)))]


@pytest.mark.parametrize("name", list(PATHS))
def test_documents_are_framed_as_the_post_processor_frames_a_sequence_plus_eos(name, tmp_path):
    rc, dest = tokenize(tmp_path, TEXTS, PATHS[name])
    assert rc == 0
    ref = hf(name)
    bos = ref.token_to_id(BOS[name]) if BOS[name] else None
    eos = ref.token_to_id(EOS[name])
    # tokenizers' own framing of one sequence (add_special_tokens=True), then the EOS
    assert stored(dest) == [e.ids + [eos] for e in ref.encode_batch(TEXTS, add_special_tokens=True)]
    assert all((d[0] == bos) == (bos is not None) for d in stored(dest))
    framing = read_manifest(str(dest)).tokenizer.framing
    assert (framing.bos_id, framing.eos_id, framing.special_tokens) == (bos, eos, "text")


@pytest.mark.parametrize("engine", ["hf", "gigatoken", "tiktoken"])
def test_every_engine_gives_the_same_framed_ids(engine, tmp_path):
    rc, dest = tokenize(tmp_path, TEXTS + SPECIAL_TEXTS, PATHS["llama3"], "--engine", engine,
                        "--special-tokens", "parse")
    assert rc == 0
    ref = hf("llama3", parse=True)
    assert stored(dest) == [e.ids + [4001] for e in ref.encode_batch(TEXTS + SPECIAL_TEXTS, add_special_tokens=True)]


def test_no_bos_and_bos_override_the_template(tmp_path, capsys):
    rc, dest = tokenize(tmp_path, TEXTS, PATHS["llama3"], "--no-bos", out="nobos")
    assert rc == 0 and stored(dest) == [e.ids + [4001] for e in hf("llama3").encode_batch(TEXTS,
                                                                                         add_special_tokens=False)]
    assert read_manifest(str(dest)).tokenizer.framing.bos_id is None
    # GPT-2 names no BOS: --bos alone is one line saying what to pass
    rc, _ = tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--bos", out="gpt2bos")
    err = capsys.readouterr().err
    assert rc == 2 and "--bos-token" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc, dest = tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--bos-token", "<|endoftext|>", "--no-eos", out="gpt2tok")
    assert rc == 0 and all(d[0] == 50256 and d[-1] != 50256 for d in stored(dest))
    framing = read_manifest(str(dest)).tokenizer.framing
    assert (framing.bos_id, framing.eos_id) == (50256, None)
    rc, _ = tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--bos-token", "<|no such token|>", out="gpt2bad")
    err = capsys.readouterr().err
    assert rc == 2 and "no such token" in err and len(err.strip().splitlines()) == 1


def _with(tmp_path, name: str, edit=None, config: dict | None = None) -> pathlib.Path:
    """A copy of a family tokenizer in a folder of its own, its tokenizer.json edited and a tokenizer_config.json
    beside it."""
    folder = tmp_path / f"tok-{name}"
    folder.mkdir(exist_ok=True)
    obj = json.loads(PATHS[name].read_text(encoding="utf-8"))
    if edit:
        edit(obj)
    (folder / "tokenizer.json").write_text(json.dumps(obj), encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "tokenizer.json"


def _template_ends_in_eos(obj: dict) -> None:
    single = [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|end_of_text|>", "type_id": 0}}]
    template = obj["post_processor"]["processors"][1]
    template["single"] = single
    template["special_tokens"]["<|end_of_text|>"] = {"id": "<|end_of_text|>", "ids": [4001],
                                                      "tokens": ["<|end_of_text|>"]}


def test_a_template_that_ends_in_eos_gets_no_second_one(tmp_path):
    path = _with(tmp_path, "llama3", _template_ends_in_eos)
    ref = HF.from_file(str(path))
    assert ref.encode("x", add_special_tokens=True).ids[-1] == 4001  # the template itself ends in EOS
    rc, dest = tokenize(tmp_path, TEXTS, path)
    assert rc == 0
    docs = stored(dest)
    assert docs == [e.ids for e in ref.encode_batch(TEXTS, add_special_tokens=True)]
    assert all(d[0] == 4000 and d[-1] == 4001 and d[-2] != 4001 for d in docs)


def test_eos_from_tokenizer_config_and_eos_token_overrides_it(tmp_path, capsys):
    eot = hf("llama3").token_to_id("<|eot_id|>")
    path = _with(tmp_path, "llama3", config={"bos_token": "<|begin_of_text|>",
                                             "eos_token": {"content": "<|eot_id|>", "special": True}})
    rc, dest = tokenize(tmp_path, TEXTS, path, out="config")
    assert rc == 0 and all(d[-1] == eot for d in stored(dest))
    meta = read_manifest(str(dest)).tokenizer
    assert meta.eos_id == meta.framing.eos_id == eot
    rc, dest = tokenize(tmp_path, TEXTS, path, "--eos-token", "<|end_of_text|>", out="flag")
    assert rc == 0 and all(d[-1] == 4001 for d in stored(dest))
    assert read_manifest(str(dest)).tokenizer.eos_id == 4001
    rc, dest = tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--eos-token", "<|endoftext|>", "--no-eos", out="both")
    assert rc == 2 and "contradict" in capsys.readouterr().err
    # the config names the EOS: another config beside the same tokenizer.json is another output
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    rc, _ = tokenize(tmp_path, TEXTS, path, out="config")
    err = capsys.readouterr().err
    assert rc == 2 and "tokenizer_config" in err and "other settings" in err


@pytest.mark.parametrize("name", ["llama3", "qwen2", "mistral", "llama2"])
def test_special_tokens_parse_equals_tokenizers_with_specials_parsed(name, tmp_path):
    texts = SPECIAL_TEXTS + TEXTS
    rc, dest = tokenize(tmp_path, texts, PATHS[name], "--special-tokens", "parse", "--no-bos", "--no-eos")
    assert rc == 0
    assert stored(dest) == [e.ids for e in hf(name, parse=True).encode_batch(texts, add_special_tokens=False)]
    assert read_manifest(str(dest)).tokenizer.framing.special_tokens == "parse"
    rc, dest = tokenize(tmp_path, texts, PATHS[name], "--no-bos", "--no-eos", out="text")
    assert stored(dest) == [e.ids for e in hf(name).encode_batch(texts, add_special_tokens=False)]


@pytest.mark.parametrize("rule", ["text", "parse"])
def test_decode_and_inspect_honour_the_framing(rule, tmp_path, capsys):
    texts = TEXTS + SPECIAL_TEXTS[:5]
    rc, dest = tokenize(tmp_path, texts, PATHS["llama3"], "--special-tokens", rule)
    assert rc == 0
    capsys.readouterr()
    assert main(["decode", str(dest), "-o", str(tmp_path / "back.jsonl"), "--no-progress"]) == 0
    back = [json.loads(line) for line in (tmp_path / "back.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [d["text"] for d in back] == texts  # BOS and EOS gone, special-token strings that were text kept
    assert main(["inspect", str(dest)]) == 0
    shown = capsys.readouterr().out
    rule_said = "as their ids" if rule == "parse" else "as text"
    assert f"framing   BOS 4000 + text + EOS 4001; special-token strings in text {rule_said}" in shown
    assert main(["inspect", str(dest), "--json"]) == 0
    framing = json.loads(capsys.readouterr().out)["tokenizer"]["framing"]
    assert framing == {"bos_id": 4000, "eos_id": 4001, "special_tokens": rule}


def test_the_loader_yields_the_stored_framed_ids(tmp_path):
    rc, dest = tokenize(tmp_path, TEXTS, PATHS["llama3"])
    assert rc == 0
    ds = StreamingDataset(str(dest), seq_len=None, shuffle=False)
    got = sorted(d["tokens"].tolist() for d in ds)
    want = sorted(e.ids + [4001] for e in hf("llama3").encode_batch(TEXTS, add_special_tokens=True))
    assert got == want and all(d[0] == 4000 for d in got)


def test_a_rerun_with_other_framing_is_refused(tmp_path, capsys):
    assert tokenize(tmp_path, TEXTS, PATHS["llama3"])[0] == 0
    capsys.readouterr()
    for flags, said in ((["--no-bos"], "bos"), (["--special-tokens", "parse"], "special_tokens"),
                        (["--eos-token", "<|eot_id|>"], "eos_token")):
        rc, _ = tokenize(tmp_path, TEXTS, PATHS["llama3"], *flags)
        err = capsys.readouterr().err
        assert rc == 2 and "other settings" in err and said in err and len(err.strip().splitlines()) == 1
    assert tokenize(tmp_path, TEXTS, PATHS["llama3"])[0] == 0  # the same settings: complete
    assert "already complete" in capsys.readouterr().out


def _as_before_framing(dest: pathlib.Path) -> None:
    """The manifest as dataflow wrote it before framing was recorded: no `framing`, no framing settings."""
    path = dest / "index.json"
    d = json.loads(path.read_text())
    del d["tokenizer"]["framing"]
    for key in ("bos", "bos_token", "eos_token", "special_tokens"):
        del d["provenance"]["settings"][key]
    path.write_text(json.dumps(d))


def test_manifests_of_before_framing_still_read_decode_and_resume(tmp_path, capsys):
    old = read_manifest(str(pathlib.Path(__file__).resolve().parents[1] / "old_states" / "d25c0a6" / "dataset"))
    assert old.tokenizer.framing is None and old.documents == 12
    rc, dest = tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--no-bos")
    assert rc == 0
    _as_before_framing(dest)
    assert read_manifest(str(dest)).tokenizer.framing is None
    capsys.readouterr()
    assert main(["inspect", str(dest), "--decode", "2"]) == 0
    shown = capsys.readouterr().out
    assert "framing   not recorded" in shown and TEXTS[0] in shown
    assert tokenize(tmp_path, TEXTS, PATHS["gpt2"], "--no-bos")[0] == 0  # the old run's settings, said
    assert "already complete" in capsys.readouterr().out
    rc, _ = tokenize(tmp_path, TEXTS, PATHS["gpt2"])  # the default is the template's: refused, saying bos
    assert rc == 2 and "bos was false" in capsys.readouterr().err


def test_bytes_frames_with_its_eos_and_has_no_bos(tmp_path, capsys):
    rc, dest = tokenize(tmp_path, TEXTS[:2], "bytes")
    assert rc == 0 and stored(dest) == [list(t.encode()) + [256] for t in TEXTS[:2]]
    rc, _ = tokenize(tmp_path, TEXTS[:2], "bytes", "--bos", out="b2")
    assert rc == 2 and "--bos-token" in capsys.readouterr().err
    shutil.rmtree(dest)


def test_task_slices_and_their_merge_keep_the_framing(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", TEXTS * 40)
    dest = tmp_path / "ds"
    for i in range(2):
        assert main(["tokenize", str(src), "-o", str(dest), "--tokenizer", str(PATHS["llama3"]), "--workers", "1",
                     "--no-progress", "--num-tasks", "2", "--task-index", str(i), "--unit-size", "64KB",
                     "--val-fraction", "0.2"]) == 0
    assert main(["merge", str(dest)]) == 0
    for split in ("train", "val"):
        framing = read_manifest(str(dest / split)).tokenizer.framing
        assert (framing.bos_id, framing.eos_id, framing.special_tokens) == (4000, 4001, "text")
        assert all(d[0] == 4000 and d[-1] == 4001 for d in stored(dest / split))
