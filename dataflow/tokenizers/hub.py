"""`--tokenizer ORG/NAME[@REVISION]` (or `hf:ORG/NAME[@REVISION]`): the `tokenizer.json` of a Hugging Face Hub
repository, from huggingface_hub's cache first.

Which spec is a Hub repository: `hf:REPO[@REVISION]` always (a bare `hf:gpt2` too); `ORG/NAME[@REVISION]` when no
file or folder of that name is here (a local path that exists wins), ORG/NAME has one `/`, and the spec has no
`://` and does not end in `.json` or `.tiktoken`.

The cache is huggingface_hub's (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub), laid out as
huggingface_hub lays it out: `models--ORG--NAME/refs/REVISION` holds the commit a branch or tag named last,
`snapshots/COMMIT/` the files of that commit, `.no_exist/COMMIT/FILE` a file the Hub said it does not have. It
is read here without importing huggingface_hub (0.4 s a process): a cached file is used as it is, without asking
the Hub (pin a commit with @REVISION; `hf download` refreshes a branch). A file not cached is downloaded into the
cache by huggingface_hub (the `hub` extra), unless HF_HUB_OFFLINE is set: then one line says what to download.
`tokenizer_config.json` is downloaded with it when the repository has one: its `bos_token`/`eos_token` frame the
documents (hf_reference.config_tokens reads it beside the tokenizer.json). A cached tokenizer.json never waits on
the network for it (huggingface_hub retries an unreachable Hub for ~20 s): one absent from the cache is said in a
warning, with the command that fetches it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from dataflow.errors import ConfigError

log = logging.getLogger(__name__)

PREFIX = "hf:"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
EXTRA = "pip install 'dataflow-lm[hub]'"
_NAME = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?"
_REPO = re.compile(rf"(?:{_NAME}/)?{_NAME}", re.ASCII)  # the Hub's repo ids: `gpt2`, `meta-llama/Llama-3.1-8B`
_REVISION = re.compile(r"[\w.-]+(?:/[\w.-]+)*", re.ASCII)  # a branch, tag (`v1.0`, `refs/pr/1`) or commit
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class HubFile:
    """A repository's `tokenizer.json` in the cache: the repository, the commit it is of, its local path."""

    repo: str
    revision: str  # the commit (40 hex digits), whatever branch or tag the spec named
    path: str


def parse(spec: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) when `spec` names a Hub repository (see the module), else None; a
    ConfigError of one line for an `hf:` spec that is no repository id."""
    explicit = spec.startswith(PREFIX)
    if not explicit and (spec.partition("@")[0].count("/") != 1 or "://" in spec or spec.endswith((".json", ".tiktoken"))
                         or os.path.exists(spec)):
        return None
    repo, at, revision = spec[len(PREFIX):].partition("@") if explicit else spec.partition("@")
    if _REPO.fullmatch(repo) and "--" not in repo and ".." not in repo and (explicit or "/" in repo) \
            and (not at or (_REVISION.fullmatch(revision) and ".." not in revision)):
        return repo, revision or None
    if explicit:
        raise ConfigError(f"--tokenizer {spec}: not a Hugging Face Hub repository id; pass hf:ORG/NAME or "
                          "hf:ORG/NAME@REVISION (a branch, tag or commit)")
    return None


def label(repo: str, revision: str | None) -> str:
    return repo if revision is None else f"{repo}@{revision}"


def cache_dir() -> str:
    """huggingface_hub's cache folder, by its own rule (huggingface_hub.constants), read when called."""
    home = os.getenv("HF_HOME") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                "huggingface")
    hub = os.getenv("HF_HUB_CACHE") or os.getenv("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return os.path.expandvars(os.path.expanduser(hub))


def offline() -> bool:
    """Whether huggingface_hub is told to stay offline (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE)."""
    return any(os.getenv(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached(repo: str, revision: str | None, filename: str = TOKENIZER_FILE) -> str | bool | None:
    """The path of `filename` of `repo` at `revision` (default `main`) in the cache; False where the cache
    records that the commit has no such file; None where the cache does not know."""
    folder = os.path.join(cache_dir(), "models--" + repo.replace("/", "--"))
    commit = _commit_of(folder, revision or "main")
    if commit is None:
        return None
    path = os.path.join(folder, "snapshots", commit, filename)
    if os.path.isfile(path):  # a snapshot entry links to its blob: a dangling link is a file not there
        return path
    return False if os.path.isfile(os.path.join(folder, ".no_exist", commit, filename)) else None


def _commit_of(folder: str, revision: str) -> str | None:
    try:
        with open(os.path.join(folder, "refs", revision)) as f:
            commit = f.read().strip()
    except (OSError, ValueError):
        commit = revision
    return commit if _COMMIT.fullmatch(commit) else None


def resolve(repo: str, revision: str | None) -> HubFile:
    """The repository's tokenizer.json (and tokenizer_config.json when it has one) from the cache, downloaded
    into it when absent and not offline; a ConfigError of one line saying what to do when it cannot be had."""
    path = cached(repo, revision)
    fetched = not isinstance(path, str)
    if fetched:
        if offline() or path is False:
            why = ("the cache records that it has no tokenizer.json" if path is False else
                   f"not in the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE is set")
            raise ConfigError(f"--tokenizer {label(repo, revision)}: {why}: {_todo(repo, revision)}")
        path = _download(repo, revision, TOKENIZER_FILE)
    found = HubFile(repo, os.path.basename(os.path.dirname(path)), path)
    if fetched and cached(repo, found.revision, CONFIG_FILE) is None:  # the Hub answers: ask it for this one too
        _download(repo, found.revision, CONFIG_FILE, optional=True)
    if cached(repo, found.revision, CONFIG_FILE) is None:  # neither there nor known to be absent
        log.warning("%s: %s of commit %s is not in the Hugging Face cache, so its bos_token/eos_token are not "
                    "known (the tokenizer.json's own EOS ends the documents); to have it: %s", repo, CONFIG_FILE,
                    found.revision, _command(repo, found.revision))
    return found


def _command(repo: str, revision: str | None) -> str:
    rev = "" if revision is None else f" --revision {revision}"
    return f"`hf download {repo} {TOKENIZER_FILE} {CONFIG_FILE}{rev}`"


def _todo(repo: str, revision: str | None) -> str:
    return (f"run {_command(repo, revision)} where the Hub can be reached (it fills this cache; HF_HUB_CACHE "
            f"chooses it), or pass the path to a tokenizer.json")


def _download(repo: str, revision: str | None, filename: str, optional: bool = False) -> str | None:
    """`filename` downloaded into the cache by huggingface_hub (its path); None for an `optional` file the
    repository lacks or that cannot be had (said in a warning)."""
    spec = label(repo, revision)
    try:
        from huggingface_hub import errors, hf_hub_download
    except ImportError:
        if optional:
            return None
        raise ConfigError(f"--tokenizer {spec}: not in the Hugging Face cache ({cache_dir()}), and huggingface_hub, "
                          f"which downloads it, is not installed: {EXTRA}, or pass the path to a "
                          "tokenizer.json") from None
    hub_log = logging.getLogger("huggingface_hub")  # its retries are a line each: the outcome is said in one
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        return hf_hub_download(repo, filename, revision=revision, cache_dir=cache_dir())
    except Exception as e:  # noqa: BLE001  (huggingface_hub's errors, named below; anything else is one line too)
        why = _why(e, errors, repo, revision, filename)
        if optional:
            if not isinstance(e, errors.EntryNotFoundError) or isinstance(e, errors.LocalEntryNotFoundError):
                log.warning("%s: %s not downloaded (%s); the tokenizer.json's own EOS ends the documents", spec,
                            filename, why)
            return None
        raise ConfigError(f"--tokenizer {spec}: {why}") from None
    finally:
        hub_log.setLevel(level)


def _why(e: Exception, errors: Any, repo: str, revision: str | None, filename: str) -> str:
    """One line for a failed download: what is wrong and what to do."""
    inner = e.__cause__ or e.__context__ or e  # huggingface_hub wraps the connection's own error
    first = f"{type(inner).__name__}: " + (str(inner).strip().splitlines() or [""])[0][:200]
    login = "log in with `hf auth login` or set HF_TOKEN"
    if isinstance(e, errors.GatedRepoError):
        return f"a gated repository: accept its terms at https://huggingface.co/{repo} and {login}"
    if isinstance(e, errors.RepositoryNotFoundError):
        return f"no such repository on the Hugging Face Hub (or a private one: {login}); check the name"
    if isinstance(e, errors.RevisionNotFoundError):
        return f"the repository has no revision {revision!r}; pass a branch, tag or commit it has"
    if isinstance(e, errors.EntryNotFoundError) and not isinstance(e, errors.LocalEntryNotFoundError):
        return (f"the repository has no {filename} (a tokenizer.json is read; for a .tiktoken file pass "
                "tiktoken:PATH)")
    return (f"not in the Hugging Face cache and the Hub cannot be reached ({first}): "
            f"{_todo(repo, revision)}")
