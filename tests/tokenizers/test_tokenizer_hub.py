"""`--tokenizer ORG/NAME[@REVISION]` (issue 34 item 3): a Hub repository's tokenizer.json from huggingface_hub's
cache, offline. The cache is laid out as huggingface_hub lays it out (models--ORG--NAME/ with blobs/, snapshots/
COMMIT/ links into them, refs/BRANCH holding a commit, .no_exist/COMMIT/FILE), built here from the shipped
family tokenizers (tests/data/tokenizers/); HF_HUB_OFFLINE is set, so nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess

import pytest
from tokenizers import Tokenizer as HF

from support.data import GPT2_JSON
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`
from dataflow.cli import main
from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import Manifest, read_manifest
from dataflow.formats.reader import iter_documents
from dataflow.tokenizers.load import load_tokenizer

FAMILIES = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizers"
PATHS = {"gpt2": pathlib.Path(GPT2_JSON), **{name: FAMILIES / name / "tokenizer.json"
                                             for name in ("llama3", "qwen2", "llama2", "mistral")}}
TEXTS = ["In the beginning God created the heaven and the earth.", "Ünïcödé café 中文 😀 🇫🇷 1234567",
         "code:\n\tdef f(x):\n\t\treturn x ** 2\n", "   long    whitespace\n\n\n", "a <|endoftext|> <s> [INST]"]
COMMIT_A, COMMIT_B = "a" * 40, "0123456789abcdef" * 2 + "01234567"


def reference(family: str) -> HF:
    """`tokenizers` itself as the exactness rule sets it: special-token strings in a text are text."""
    tok = HF.from_file(str(PATHS[family]))
    tok.encode_special_tokens = True
    return tok


def put(cache: pathlib.Path, repo: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ("main",),
        missing: tuple[str, ...] = ()) -> pathlib.Path:
    """One commit of `repo` in the cache as huggingface_hub writes it; `missing`: files the Hub said it lacks."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    for name in missing:
        (folder / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
        (folder / ".no_exist" / commit / name).touch()
    for ref in refs:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def tokenize(tmp_path: pathlib.Path, tokenizer: str, out: str = "ds") -> pathlib.Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["tokenize", str(src), "-o", str(tmp_path / out), "--tokenizer", tokenizer, "--workers", "1",
                 "--no-progress"]) == 0
    return tmp_path / out


def stored(dest: pathlib.Path) -> list[list[int]]:
    return [t.tolist() for _, t in iter_documents(str(dest), read_manifest(str(dest)))]


@pytest.mark.parametrize("family", list(PATHS))
def test_a_repository_in_the_cache_gives_the_ids_of_the_local_file(cache, family):
    put(cache, f"acme/{family}", COMMIT_A, {"tokenizer.json": PATHS[family].read_bytes()})
    from_hub = load_tokenizer(f"acme/{family}")
    expected = [e.ids for e in reference(family).encode_batch(TEXTS, add_special_tokens=False)]
    assert [ids.tolist() for ids in from_hub.encode_batch(TEXTS)] == expected
    assert [ids.tolist() for ids in load_tokenizer(str(PATHS[family])).encode_batch(TEXTS)] == expected
    assert from_hub.engine == load_tokenizer(str(PATHS[family])).engine


def test_the_manifest_records_repository_commit_and_sha256(cache, tmp_path):
    data = PATHS["llama3"].read_bytes()
    config = json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}).encode()
    put(cache, "meta-llama/Llama-3.1-8B", COMMIT_A, {"tokenizer.json": data, "tokenizer_config.json": config})
    dest = tokenize(tmp_path, "meta-llama/Llama-3.1-8B")
    meta = read_manifest(str(dest)).tokenizer
    assert (meta.repo, meta.revision, meta.sha256) == ("meta-llama/Llama-3.1-8B", COMMIT_A,
                                                        hashlib.sha256(data).hexdigest())
    assert meta.name == "meta-llama/Llama-3.1-8B"
    assert (dest / "tokenizer.json").read_bytes() == data  # the copy is the file, not the cache's link
    ref = reference("llama3")
    eot = ref.token_to_id("<|eot_id|>")  # the repository's tokenizer_config.json, read from the same snapshot
    assert meta.framing.eos_id == eot
    assert stored(dest) == [e.ids + [eot] for e in ref.encode_batch(TEXTS, add_special_tokens=True)]
    local = tokenize(tmp_path, str(PATHS["llama3"]), out="local")
    assert read_manifest(str(local)).tokenizer.repo is None and read_manifest(str(local)).tokenizer.revision is None


def test_revision_chooses_the_snapshot(cache, tmp_path):
    put(cache, "acme/tok", COMMIT_A, {"tokenizer.json": PATHS["llama3"].read_bytes()}, refs=("main",))
    put(cache, "acme/tok", COMMIT_B, {"tokenizer.json": PATHS["qwen2"].read_bytes()}, refs=("v2",))
    for spec, commit, family in [("acme/tok", COMMIT_A, "llama3"), ("acme/tok@main", COMMIT_A, "llama3"),
                                 ("acme/tok@v2", COMMIT_B, "qwen2"), (f"acme/tok@{COMMIT_B}", COMMIT_B, "qwen2"),
                                 (f"hf:acme/tok@{COMMIT_A}", COMMIT_A, "llama3")]:
        tok = load_tokenizer(spec)
        assert (tok.meta.revision, tok.meta.sha256) == (commit, hashlib.sha256(PATHS[family].read_bytes()).hexdigest())
        expected = reference(family).encode_batch(TEXTS, add_special_tokens=False)
        assert [ids.tolist() for ids in tok.encode_batch(TEXTS)] == [e.ids for e in expected], spec
    with pytest.raises(ConfigError, match="--revision v3"):
        load_tokenizer("acme/tok@v3")


def test_a_local_path_that_exists_wins(cache, tmp_path, monkeypatch):
    put(cache, "acme/tok", COMMIT_A, {"tokenizer.json": PATHS["llama3"].read_bytes()})
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "tok").write_bytes(PATHS["llama2"].read_bytes())
    monkeypatch.chdir(tmp_path)
    tok = load_tokenizer("acme/tok")
    assert tok.meta.repo is None
    assert tok.meta.sha256 == hashlib.sha256(PATHS["llama2"].read_bytes()).hexdigest()
    assert load_tokenizer("hf:acme/tok").meta.repo == "acme/tok"  # the explicit form is the Hub's


def test_a_bare_name_is_a_repository_only_when_said(cache):
    put(cache, "gpt2", COMMIT_A, {"tokenizer.json": PATHS["gpt2"].read_bytes()})
    assert load_tokenizer("hf:gpt2").meta.repo == "gpt2"
    with pytest.raises(ConfigError, match="hf:ORG/NAME"):
        load_tokenizer("gpt2")  # no file of that name: the message names the forms, the Hub's among them


def _cli(tmp_path: pathlib.Path, tokenizer: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    return run_dataflow("tokenize", src, "-o", tmp_path / "out", "--tokenizer", tokenizer, "--no-progress",
                        env={**os.environ, **env}, timeout=120)


@pytest.mark.parametrize("spec, command", [
    ("meta-llama/Llama-3.1-8B", "`hf download meta-llama/Llama-3.1-8B tokenizer.json tokenizer_config.json`"),
    ("acme/tok@v3", "`hf download acme/tok tokenizer.json tokenizer_config.json --revision v3`"),
])
def test_offline_a_repository_not_in_the_cache_is_one_line_saying_what_to_download(cache, tmp_path, spec, command):
    put(cache, "acme/tok", COMMIT_A, {"tokenizer.json": PATHS["llama3"].read_bytes()})
    p = _cli(tmp_path, spec, {})
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert command in p.stderr and "HF_HUB_OFFLINE" in p.stderr and str(cache) in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_repository_the_cache_says_lacks_a_tokenizer_json_is_one_line(cache, tmp_path):
    put(cache, "acme/spm", COMMIT_A, {"tokenizer.model": b"x"}, missing=("tokenizer.json",))
    p = _cli(tmp_path, "acme/spm", {})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "no tokenizer.json" in p.stderr, p.stderr


def test_without_huggingface_hub_a_download_is_one_line_naming_the_extra(cache, tmp_path):
    blocked = tmp_path / "blocked" / "huggingface_hub"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('No module named huggingface_hub')\n")
    p = _cli(tmp_path, "acme/absent", {"HF_HUB_OFFLINE": "0",
                                       "PYTHONPATH": os.pathsep.join([str(blocked.parent), os.getcwd()])})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "pip install 'dataflow-lm[hub]'" in p.stderr, p.stderr


def test_manifests_without_the_provenance_still_load_and_a_bad_one_is_refused(tmp_path):
    dest = tokenize(tmp_path, str(PATHS["gpt2"]))
    d = json.loads((dest / "index.json").read_text())
    assert "repo" not in d["tokenizer"] and "revision" not in d["tokenizer"]  # a local file's manifest is as before
    assert Manifest.from_dict(d).tokenizer.repo is None
    d["tokenizer"]["revision"] = 7
    with pytest.raises(FormatError, match="revision"):
        Manifest.from_dict(d)


def test_a_cached_tokenizer_json_never_asks_the_hub_for_its_config(cache, monkeypatch, caplog):
    """Online, a cached tokenizer.json is used as it is: no download is tried for a tokenizer_config.json the cache
    lacks (huggingface_hub retries an unreachable Hub for ~20 s); a warning names the command that fetches it."""
    from dataflow.tokenizers import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "_download", lambda *a, **k: pytest.fail(f"downloaded {a}"))
    put(cache, "acme/tok", COMMIT_A, {"tokenizer.json": PATHS["llama3"].read_bytes()})
    assert load_tokenizer("acme/tok").meta.revision == COMMIT_A
    assert f"`hf download acme/tok tokenizer.json tokenizer_config.json --revision {COMMIT_A}`" in caplog.text


def _error(name: str) -> Exception:
    """One of huggingface_hub's errors, made without the HTTP response its constructor reads."""
    from huggingface_hub import errors

    cls = getattr(errors, name, None) or errors.EntryNotFoundError  # (RemoteEntryNotFoundError: huggingface_hub 1.0+)
    e = cls.__new__(cls)
    Exception.__init__(e, f"{name} (test)")
    return e


def test_a_download_fills_the_cache_with_both_files(cache, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    asked = []

    def download(repo, filename, revision=None, cache_dir=None):
        asked.append((repo, filename, revision, cache_dir))
        if filename == "tokenizer_config.json":  # the Hub has none: it records that, and says so
            put(cache, repo, COMMIT_B, {}, refs=(), missing=(filename,))
            raise _error("RemoteEntryNotFoundError")
        return str(put(cache, repo, COMMIT_B, {filename: PATHS["qwen2"].read_bytes()}) / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    tok = load_tokenizer("acme/new")
    assert (tok.meta.repo, tok.meta.revision) == ("acme/new", COMMIT_B)
    assert [ids.tolist() for ids in tok.encode_batch(TEXTS)] == \
        [e.ids for e in reference("qwen2").encode_batch(TEXTS, add_special_tokens=False)]
    assert asked == [("acme/new", "tokenizer.json", None, str(cache)),
                     ("acme/new", "tokenizer_config.json", COMMIT_B, str(cache))]
    assert load_tokenizer("acme/new").meta.revision == COMMIT_B and len(asked) == 2  # from the cache now


@pytest.mark.parametrize("error, says", [
    ("GatedRepoError", "gated repository: accept its terms at https://huggingface.co/acme/tok and log in"),
    ("RepositoryNotFoundError", "no such repository on the Hugging Face Hub"),
    ("RevisionNotFoundError", "the repository has no revision 'v9'"),
    ("RemoteEntryNotFoundError", "the repository has no tokenizer.json"),
    ("LocalEntryNotFoundError", "the Hub cannot be reached"),
])
def test_a_failed_download_is_one_line_saying_what_to_do(cache, monkeypatch, error, says):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: (_ for _ in ()).throw(_error(error)))
    with pytest.raises(ConfigError) as e:
        load_tokenizer("acme/tok@v9")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("spec, parsed", [
    ("meta-llama/Llama-3.1-8B", ("meta-llama/Llama-3.1-8B", None)), ("acme/tok@v1.0", ("acme/tok", "v1.0")),
    ("acme/tok@refs/pr/1", ("acme/tok", "refs/pr/1")), ("hf:gpt2", ("gpt2", None)),
    ("data/tok.json", None), ("a/b/c", None), ("s3://bucket/tok", None), ("./acme/tok", None),
    ("acme/tok@../../x", None), ("ünï/tok", None), ("tiktoken:acme/tok", None),
])
def test_which_specs_name_a_hub_repository(spec, parsed):
    from dataflow.tokenizers import hub

    assert hub.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["hf:acme/tok@", "hf:../x", "hf:acme/x--y", "hf:a/b/c"])
def test_an_hf_spec_that_is_no_repository_id_is_one_line(spec):
    with pytest.raises(ConfigError, match="not a Hugging Face Hub repository id") as e:
        load_tokenizer(spec)
    assert "\n" not in str(e.value)


def test_a_branch_moved_to_another_commit_is_another_tokenizer(cache, tmp_path, capsys):
    """The settings record a Hub tokenizer by its file's content: a rerun after `main` moved to a commit with
    another tokenizer.json is refused, naming the tokenizer, instead of adding shards of other ids; the same
    commit again (by branch or by commit) finds the dataset complete."""
    put(cache, "acme/tok", COMMIT_A, {"tokenizer.json": PATHS["llama3"].read_bytes()})
    dest = tokenize(tmp_path, "acme/tok")
    settings = json.loads((dest / "index.json").read_text())["provenance"]["settings"]
    assert settings["tokenizer"] == "sha256:" + hashlib.sha256(PATHS["llama3"].read_bytes()).hexdigest()
    assert main(["tokenize", str(tmp_path / "in.jsonl"), "-o", str(dest), "--tokenizer", f"acme/tok@{COMMIT_A}",
                 "--workers", "1", "--no-progress"]) == 0
    assert "already complete" in capsys.readouterr().out
    put(cache, "acme/tok", COMMIT_B, {"tokenizer.json": PATHS["qwen2"].read_bytes()})  # main moves
    assert main(["tokenize", str(tmp_path / "in.jsonl"), "-o", str(dest), "--tokenizer", "acme/tok", "--workers",
                 "1", "--no-progress"]) == 2
    assert "other settings (tokenizer)" in capsys.readouterr().err
