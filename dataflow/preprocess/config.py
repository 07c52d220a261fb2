"""The settings of a `dataflow tokenize` run (`TokenizeConfig`): what they are, which of them change the
output bytes (`output_settings`: a rerun must match them to resume), the checks that refuse settings that
cannot work, and the framing of the documents they give with a tokenizer (`framing_of`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import fsspec

from dataflow.debug import cause
from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.manifest import SPECIAL_TOKEN_RULES, Framing, TokenizerMeta
from dataflow.formats.remote_errors import missing_backend
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, check_shard_size, check_zstd_level, parse_size
from dataflow.preprocess.executors import check_executor
from dataflow.preprocess.journal import input_digest
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES
from dataflow.tokenizers.hf_reference import CONFIG_NAME
from dataflow.tokenizers.tiktoken_files import split_spec, tiktoken_spec

if TYPE_CHECKING:
    from dataflow.tokenizers.base import Tokenizer

MIN_UNIT_SIZE = 64 << 10  # --unit-size below this only multiplies units (a 1-byte unit per input byte)


@dataclass
class TokenizeConfig:
    inputs: list[str]
    out: str
    tokenizer: str = "bytes"
    engine: str = "auto"
    text_field: str = "text"
    id_field: str = "id"
    format: str = "arrow"
    compression: str = "zstd"
    zstd_level: int | None = None
    shard_size: int | str = DEFAULT_SHARD_SIZE
    workers: int | str = "auto"  # "auto" (or 0): one per CPU
    executor: str = "local"
    seed: int = 0
    val_fraction: float = 0.0
    eos: bool = True  # the EOS after each document (see config.framing_of)
    bos: bool | None = None  # the BOS before it: None = as the tokenizer's post-processor frames a sequence
    bos_token: str | None = None  # the BOS's string (default: the template's, else tokenizer_config.json's)
    eos_token: str | None = None  # the EOS's string (default: tokenizer_config.json's, else the tokenizer's own)
    special_tokens: str = "text"  # "text": special-token strings in documents encoded as text; "parse": as ids
    max_errors: int = 100
    unit_bytes: int | None = None  # input per bundle of work (None: DEFAULT_UNIT_BYTES); shards never span two
    num_tasks: int = 1
    task_index: int = 0
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        self.out = output_location(self.out)

    def output_settings(self, inputs: list[list[Any]]) -> dict[str, Any]:
        """Everything that changes the output bytes; a rerun must match these to resume. `inputs`: the files
        the inputs name, as [name in ids, bytes] (`startup.TaskPlan.inputs`), not the arguments as typed: a
        file added, removed or resized since an interrupted run would shift every unit after it."""
        d = asdict(self)
        for k in ("out", "workers", "executor", "task_index", "overwrite", "progress", "max_errors"):
            d.pop(k)
        d["inputs"] = input_digest(inputs)
        d["unit_bytes"] = self.unit_bytes or DEFAULT_UNIT_BYTES  # shards end where bundles end
        d["shard_size"] = parse_size(self.shard_size)
        d["tokenizer"] = tokenizer_identity(self.tokenizer)
        d["bos"] = "template" if self.bos is None else self.bos
        beside = config_identity(self.tokenizer)  # it may name the EOS: another one is other output
        if beside is not None:
            d["tokenizer_config"] = beside
        return json.loads(json.dumps(d))

    def check(self) -> None:
        """Refuse settings that cannot work or contradict each other: one `ConfigError` line naming the flag."""
        if not self.out:
            raise ConfigError("-o/--out is empty; pass the folder or URL to write the dataset to")
        if self.out.rstrip("/").endswith(".json"):
            raise ConfigError(f"-o {self.out}: a dataset is a folder, and a path ending in .json names a manifest "
                              f"file to every reader (verify, decode, the loader); name the folder without .json")
        worker_count(self.workers)
        check_executor(self.executor)
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"--val-fraction must lie in [0, 1), got {self.val_fraction}")
        if self.num_tasks < 1:
            raise ConfigError(f"--num-tasks must be 1 or more (the number of task slices), got {self.num_tasks}")
        if not 0 <= self.task_index < self.num_tasks:
            raise ConfigError(f"--task-index {self.task_index} must lie in [0, --num-tasks {self.num_tasks})")
        if self.max_errors < 0:
            raise ConfigError("--max-errors must be >= 0")
        if self.zstd_level is not None and self.compression != "zstd":
            raise ConfigError(f"--zstd-level {self.zstd_level} goes with --compression zstd, not --compression "
                              f"{self.compression}; drop one of the two")
        check_zstd_level(self.zstd_level, "--zstd-level")
        if self.unit_bytes is not None and self.unit_bytes < MIN_UNIT_SIZE:
            raise ConfigError(f"--unit-size: {self.unit_bytes:,} bytes is below the {MIN_UNIT_SIZE >> 10}KB minimum "
                              f"(smaller units only add overhead); pass a larger size, or leave it out")
        check_shard_size(self.shard_size, "--shard-size")
        self._check_framing()

    def _check_framing(self) -> None:
        if self.special_tokens not in SPECIAL_TOKEN_RULES:
            raise ConfigError(f"--special-tokens {self.special_tokens!r}: choose text (special-token strings in "
                              "documents encoded as the text they are) or parse (as their ids)")
        if self.bos is False and self.bos_token is not None:
            raise ConfigError(f"--no-bos and --bos-token {self.bos_token} contradict each other; drop one")
        if not self.eos and self.eos_token is not None:
            raise ConfigError(f"--no-eos and --eos-token {self.eos_token} contradict each other; drop one")
        for flag, token in (("--bos-token", self.bos_token), ("--eos-token", self.eos_token)):
            if token is not None and not token:
                raise ConfigError(f"{flag} is empty; pass the token's string (e.g. <|endoftext|>)")


def output_location(out: str) -> str:
    """-o as the place it names: `file:///abs/ds` is the folder /abs/ds (not ./file:/abs/ds); a URL's path
    without repeated or trailing slashes (`s3://b//ds/` is `s3://b/ds`, the one prefix the store writes and
    the run lock is keyed by), so a rerun spelled otherwise finds its dataset."""
    out = remote.local_path(out)
    if not remote.is_remote(out):
        return out
    scheme, _, path = out.partition("://")
    return f"{scheme}://{re.sub('/+', '/', path).rstrip('/')}" if path.strip("/") else out


def worker_count(workers: int | str) -> int:
    """--workers as a number of processes: "auto" (or 0, its old spelling) is one per CPU."""
    if workers != "auto" and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"--workers {workers}: pass a number of worker processes (1 or more), or auto for one "
                          f"per CPU")
    return workers if workers not in ("auto", 0) else os.cpu_count() or 1


def tokenizer_identity(spec: str) -> str:
    """What the settings record of `--tokenizer`: its file's content (`sha256:HEX`, `tiktoken:sha256:HEX`), not
    the path it was given by: `./tok.json`, its absolute path and an identical copy are one tokenizer. A spec
    that names no readable file (`bytes`, or a file gone) stays as it is."""
    file_spec, pattern = split_spec(spec)
    if pattern is not None:  # --tiktoken-pattern travels in the spec (tiktoken_files.tiktoken_spec): keep it
        return tiktoken_spec(tokenizer_identity(file_spec), pattern)
    prefix, path = ("tiktoken:", spec[len("tiktoken:"):]) if spec.startswith("tiktoken:") else ("", spec)
    if spec == "bytes" or spec.startswith("sha256:") or path.startswith("sha256:"):
        return spec
    digest = _file_digest(path)
    return f"{prefix}sha256:{digest}" if digest else spec


def config_identity(spec: str) -> str | None:
    """`sha256:HEX` of the tokenizer_config.json beside a tokenizer.json (it names the BOS and EOS the documents
    are framed with), None when there is none (or the tokenizer is no tokenizer.json)."""
    if spec == "bytes" or spec.startswith("tiktoken:") or spec.startswith("sha256:"):
        return None
    path = spec.rsplit("/", 1)[0] + "/" + CONFIG_NAME if "/" in spec else CONFIG_NAME
    digest = _file_digest(path)
    return f"sha256:{digest}" if digest else None


def _file_digest(path: str) -> str | None:
    """The sha256 of the file at `path` (a local path or URL; remembered per local file's size and mtime), or None
    for a local path with no file."""
    stamp = None
    if "://" not in path:
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    return _content_sha256(path, stamp)


@functools.lru_cache(maxsize=16)
def _content_sha256(path: str, stamp: tuple | None) -> str | None:
    """sha256 of a file or URL (`stamp`: a local file's identity, so that a changed file is read again)."""
    h = hashlib.sha256()
    try:
        with fsspec.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except ImportError as e:  # gcsfs for gs://, ...: one line naming the extra
        raise missing_backend(path, e) from cause(e)
    except (OSError, ValueError):
        return None
    return h.hexdigest()

# --- the framing of the documents -------------------------------------------------------------------
# By default a document is framed as the tokenizer's post-processor frames a single sequence (Llama-3 and
# Llama-2/Mistral: BOS first; GPT-2, Qwen: nothing), then the toolkit appends the EOS: --eos-token, else the
# eos_token of the tokenizer_config.json beside the tokenizer.json, else the tokenizer's own end-of-text token.
# A template that already ends in that EOS gets no second one. --bos/--no-bos, --eos/--no-eos and --bos-token
# override. The framing is applied to the engine's ids (tokenizers/flat.py `frame`), so every engine gives the
# same framed ids; the manifest records it (formats.manifest.Framing).


def framing_of(cfg: TokenizeConfig, tok: Tokenizer) -> Framing:
    """The framing of this run's documents: `cfg`'s flags over the tokenizer's own template and config."""
    prefix, suffix = tok.template
    eos_id = _eos(cfg, tok, suffix) if cfg.eos else None
    return Framing(bos_id=_bos(cfg, tok, prefix), eos_id=eos_id, special_tokens=cfg.special_tokens)


def framed_meta(meta: TokenizerMeta, framing: Framing) -> TokenizerMeta:
    """The manifest's tokenizer entry of a framed dataset: its EOS is the one that ends the documents."""
    return replace(meta, eos_id=meta.eos_id if framing.eos_id is None else framing.eos_id, framing=framing)


def _bos(cfg: TokenizeConfig, tok: Tokenizer, prefix: tuple[int, ...]) -> int | None:
    if cfg.bos is False:
        return None
    if cfg.bos_token is not None:
        return _id_of(tok, cfg.bos_token, "--bos-token")
    if len(prefix) == 1:
        return prefix[0]
    if len(prefix) > 1:
        raise ConfigError(f"{tok.source}: its post-processor puts {len(prefix)} tokens {list(prefix)} before each "
                          "sequence, not one BOS; pass --bos-token TOKEN to start documents with one, or --no-bos")
    if cfg.bos is None:
        return None
    named = tok.config_tokens.get("bos_token")
    if named is None:
        raise ConfigError(f"--bos: the tokenizer {tok.meta.name} names no BOS (its post-processor adds none and no "
                          "tokenizer_config.json beside it names a bos_token); pass --bos-token TOKEN")
    return _id_of(tok, named, "tokenizer_config.json's bos_token")


def _eos(cfg: TokenizeConfig, tok: Tokenizer, suffix: tuple[int, ...]) -> int:
    if cfg.eos_token is not None:
        eos = _id_of(tok, cfg.eos_token, "--eos-token")
    elif "eos_token" in tok.config_tokens:
        eos = _id_of(tok, tok.config_tokens["eos_token"], "tokenizer_config.json's eos_token")
    else:
        eos = tok.meta.eos_id
    if suffix and suffix != (eos,):
        raise ConfigError(f"{tok.source}: its post-processor puts {list(suffix)} after each sequence, which is not "
                          f"the EOS {eos} the documents end with; pass --eos-token TOKEN to end them with the "
                          "template's token, or --no-eos")
    return eos


def _id_of(tok: Tokenizer, token: str, where: str) -> int:
    """The id of `token` (named by `where`); a ConfigError of one line when the tokenizer has no such token."""
    found = tok.token_id(token)
    if found is None or not 0 <= found < tok.meta.vocab_size:
        raise ConfigError(f"{where} {token!r}: the tokenizer {tok.meta.name} has no such token; pass a token of its "
                          "vocabulary or special tokens (e.g. its EOS, id "
                          f"{tok.meta.eos_id})")
    return int(found)
