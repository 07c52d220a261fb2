"""The settings of a `dataflow tokenize` run (`TokenizeConfig`): what they are and how the command line spells
them (`setting`), which of them change the output bytes (`output_settings`: a rerun must match them to resume),
the checks that refuse settings that cannot work, the resolved form the run reads (`ResolvedConfig`), and the
framing of the documents they give with a tokenizer (`framing_of`)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import operator
import os
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable

import fsspec

from dataflow.debug import cause
from dataflow.sources import DEFAULT_SEPARATOR, TextFields, parse_text_fields, separator_arg
from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.manifest import SPECIAL_TOKEN_RULES, Framing, TokenizerMeta
from dataflow.formats.remote_errors import missing_backend
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, check_shard_size, check_zstd_level, parse_size
from dataflow.preprocess.journal import input_digest
from dataflow.tokenizers import hub
from dataflow.tokenizers.hf_reference import CONFIG_NAME
from dataflow.tokenizers.tiktoken_files import split_spec, tiktoken_spec

if TYPE_CHECKING:
    from dataflow.tokenizers.base import Tokenizer

MIN_UNIT_SIZE = 64 << 10  # --unit-size below this only multiplies units (a 1-byte unit per input byte)


def setting(value: Any = MISSING, flag: tuple[str, ...] = (), help: str = "", *, output: bool = True,
            from_arg: Callable[[Any], Any] | None = None, **argparse_options: Any) -> Any:
    """A field of `TokenizeConfig` with how `dataflow tokenize` spells it (`command.py` builds its parser from
    these): `value` its default, `flag` its names (a positional's name alone), `help`, argparse's options
    (`type`, `choices`, ...; a `default` there is the command line's own), `from_arg` what turns the parsed value into the setting's, and
    `output` whether it changes the output bytes (a rerun must match those to resume: `output_settings`)."""
    metadata = {"flag": flag, "help": help, "output": output, "from_arg": from_arg, "argparse": argparse_options}
    return field(metadata=metadata) if value is MISSING else field(default=value, metadata=metadata)


def workers_arg(text: str) -> int | str:
    """--workers N, or auto (one per CPU); the range is checked with the other settings, in one line."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes nor auto") from None


def unit_size_arg(text: str | None) -> int | None:
    """--unit-size as a number of bytes (none given: the default)."""
    return parse_size(text) if text else None


@dataclass
class TokenizeConfig:
    """The settings of one `dataflow tokenize` run, as given (the command line's, or a caller's); `resolve()`
    checks them and returns the form the run uses."""

    inputs: list[str] = setting(flag=("inputs",), nargs="+", help="files, globs, folders or fsspec URLs: "
                                ".jsonl/.json (a document a line), .parquet (a document a row), .txt (a document a "
                                "file); .jsonl and .txt optionally .gz, .zst, .bz2 or .xz")
    out: str = setting(flag=("-o", "--out"), required=True, output=False, help="output dataset folder")
    tokenizer: str = setting("bytes", ("--tokenizer",), "bytes | PATH/URL to tokenizer.json | tiktoken:PATH")
    engine: str = setting("auto", ("--engine",), "what encodes a tokenizer.json: auto = the fastest engine proven "
                          "to give the ids of tokenizers (gigatoken, then tiktoken, then hf = tokenizers itself); "
                          "naming one forces it", choices=["auto", "gigatoken", "tiktoken", "hf"])
    text_field: str = setting("text", ("--text-field",), "JSON/Parquet field holding each document's text; several, "
                              "comma-separated (title,text), are joined into one document by --text-separator")
    text_separator: str = setting(DEFAULT_SEPARATOR, ("--text-separator",), "what joins the fields of a "
                                  "--text-field list (default: a blank line, \\n\\n; \\n, \\t, \\r and "
                                  "\\\\ are read as escapes)", type=separator_arg)
    id_field: str = setting("id", ("--id-field",), "field holding each document's id (a stable id is derived "
                            "from file and line when absent)")
    format: str = setting("arrow", ("--format",), "shard format: Arrow IPC files or WebDataset tars",
                          choices=["arrow", "tar"])
    compression: str = setting("zstd", ("--compression",), "shard compression", choices=["zstd", "none"])
    zstd_level: int | None = setting(None, ("--zstd-level",), "zstd level: 1 (fast) to 22 (small), or negative "
                                     "down to -131072 for faster, larger shards (default: Arrow's own, 1, for "
                                     "arrow shards; 3 for tar)", type=int)
    shard_size: int | str = setting(DEFAULT_SHARD_SIZE, ("--shard-size",), "token bytes a shard reaches before it "
                                    "ends, counted before compression (e.g. 256MB): a shard ends with the document "
                                    "that reaches it (documents are never split, so a shard may pass it by one "
                                    "document; its file also holds ids and offsets); a bundle's end also ends its "
                                    "shards", default="128MB")
    workers: int | str = setting("auto", ("--workers",), "worker processes: a number, or auto (also written 0) "
                                 "for one per CPU", output=False, type=workers_arg)
    seed: int = setting(0, ("--seed",), "seed of the per-document train/val split", type=int)
    val_fraction: float = setting(0.0, ("--val-fraction",), "share of documents put in OUT/val (0: one dataset "
                                  "in OUT, no split)", type=float)
    eos: bool = setting(True, ("--eos",), "append the EOS after each document (default; --no-eos: documents run "
                        "on unended); a post-processor template that ends in the EOS gets no second one",
                        action=argparse.BooleanOptionalAction)  # see `framing_of`
    bos: bool | None = setting(None, ("--bos",), "put the BOS before each document (default: as the tokenizer's "
                               "post-processor frames a single sequence: Llama-3, Llama-2, Mistral yes; GPT-2, "
                               "Qwen no)", action=argparse.BooleanOptionalAction)  # None: as the template says
    bos_token: str | None = setting(None, ("--bos-token",), "the BOS's string (implies --bos; default: the "
                                    "post-processor's, else tokenizer_config.json's bos_token)", metavar="TOKEN")
    eos_token: str | None = setting(None, ("--eos-token",), "the EOS's string (default: the eos_token of the "
                                    "tokenizer_config.json beside the tokenizer.json, else the tokenizer's "
                                    "end-of-text token)", metavar="TOKEN")
    special_tokens: str = setting("text", ("--special-tokens",), "special-token strings inside documents "
                                  "(<|endoftext|>, <s>): text = encoded as the text they are (default: a document "
                                  "never injects a control token); parse = as their ids, as tokenizers' encode "
                                  "gives them", choices=["text", "parse"])
    max_errors: int = setting(100, ("--max-errors",), "bad records tolerated before failing", output=False,
                              type=int)
    unit_bytes: int | None = setting(None, ("--unit-size",), "input bytes per bundle of work, 64KB or more (JSONL "
                                     "is cut into line-aligned pieces of this size, a compressed file as it is "
                                     "decompressed; default 32MB); a shard never spans two bundles, so this is an "
                                     "output setting", from_arg=unit_size_arg)  # None: DEFAULT_UNIT_BYTES
    num_tasks: int = setting(1, ("--num-tasks",), "split the job into K task slices (Slurm arrays, ...)", type=int)
    task_index: int = setting(0, ("--task-index",), "which slice this run does (0-based)", output=False, type=int)
    executor: str = setting("local", ("--executor",), "local: a process pool; ray: tasks on the Ray cluster at "
                            "RAY_ADDRESS (extra `ray`)", output=False, choices=["local", "ray"])
    overwrite: bool = setting(False, ("--overwrite",), "replace an existing dataset made with other settings",
                              output=False, action="store_true")
    progress: bool = setting(True, ("--no-progress",), "no progress bar on stderr", output=False,
                             action="store_true", from_arg=operator.not_)

    def __post_init__(self) -> None:
        self.out = output_location(self.out)

    def resolve(self) -> ResolvedConfig:
        """The settings checked (`check`) and resolved, once: sizes as integers, the worker count, the splits."""
        from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES  # (here: `dataflow`'s parser reads these fields)

        self.check()
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(shard_size=parse_size(self.shard_size), workers=worker_count(self.workers),
                      unit_bytes=self.unit_bytes or DEFAULT_UNIT_BYTES)  # shards end where bundles end
        return ResolvedConfig(**values, splits=("train",) if self.val_fraction <= 0 else ("train", "val"),
                              text=parse_text_fields(self.text_field, self.text_separator))

    def check(self) -> None:
        """Refuse settings that cannot work or contradict each other: one `ConfigError` line naming the flag."""
        from dataflow.preprocess.executors import check_executor  # (here: it starts no worker machinery)

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




@dataclass(frozen=True)
class ResolvedConfig:
    """A run's settings checked and resolved (`TokenizeConfig.resolve`): what every module of the run reads."""

    inputs: list[str]
    out: str
    tokenizer: str
    engine: str
    text_field: str
    text_separator: str
    id_field: str
    format: str
    compression: str
    zstd_level: int | None
    shard_size: int  # token bytes
    workers: int  # processes
    seed: int
    val_fraction: float
    eos: bool
    bos: bool | None
    bos_token: str | None
    eos_token: str | None
    special_tokens: str
    max_errors: int
    unit_bytes: int  # input bytes per bundle
    num_tasks: int
    task_index: int
    executor: str
    overwrite: bool
    progress: bool
    splits: tuple[str, ...]  # ("train",), or ("train", "val") with --val-fraction
    text: TextFields  # --text-field parsed: the fields joined into each document, and their separator

    @property
    def tasked(self) -> bool:
        """Whether this run is one task slice of several (`--num-tasks`), writing its `part-*`."""
        return self.num_tasks > 1

    def output_settings(self, inputs: list[list[Any]]) -> dict[str, Any]:
        """Everything that changes the output bytes; a rerun must match these to resume. `inputs`: the files
        the inputs name, as [name in ids, bytes] (`TaskPlan.inputs`), not the arguments as typed: a file
        added, removed or resized since an interrupted run would shift every unit after it. (The run computes
        them once: `task.TaskRun.settings`.)"""
        d = {f.name: getattr(self, f.name) for f in fields(TokenizeConfig) if f.metadata["output"]}
        if len(self.text.names) == 1:  # a separator joins nothing: not in the settings (older journals resume)
            d.pop("text_separator")
        d["inputs"] = input_digest(inputs)
        d["tokenizer"] = tokenizer_identity(self.tokenizer)
        d["bos"] = "template" if self.bos is None else self.bos
        beside = config_identity(self.tokenizer)  # it may name the EOS: another one is other output
        if beside is not None:
            d["tokenizer_config"] = beside
        return json.loads(json.dumps(d))

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
    digest = _file_digest(_hub_file(path) or path)
    return f"{prefix}sha256:{digest}" if digest else spec


def config_identity(spec: str) -> str | None:
    """`sha256:HEX` of the tokenizer_config.json beside a tokenizer.json (it names the BOS and EOS the documents
    are framed with), None when there is none (or the tokenizer is no tokenizer.json)."""
    if spec == "bytes" or spec.startswith("tiktoken:") or spec.startswith("sha256:"):
        return None
    path = _hub_file(spec, CONFIG_NAME) or (spec.rsplit("/", 1)[0] + "/" + CONFIG_NAME if "/" in spec else CONFIG_NAME)
    digest = _file_digest(path)
    return f"sha256:{digest}" if digest else None


def _hub_file(spec: str, filename: str = hub.TOKENIZER_FILE) -> str | None:
    """For a Hub spec (ORG/NAME[@REVISION]), `filename`'s path in the Hugging Face cache, where loading the
    tokenizer put it: the settings record the file's content, so a branch moved to another commit is another
    tokenizer (a resume is refused, naming it). None for any other spec, or a file the cache lacks."""
    named = hub.parse(spec)
    found = hub.cached(*named, filename) if named else None
    return found if isinstance(found, str) else None


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


def framing_of(cfg: ResolvedConfig, tok: Tokenizer) -> Framing:
    """The framing of this run's documents: `cfg`'s flags over the tokenizer's own template and config."""
    prefix, suffix = tok.template
    eos_id = _eos(cfg, tok, suffix) if cfg.eos else None
    return Framing(bos_id=_bos(cfg, tok, prefix), eos_id=eos_id, special_tokens=cfg.special_tokens)


def framed_meta(meta: TokenizerMeta, framing: Framing) -> TokenizerMeta:
    """The manifest's tokenizer entry of a framed dataset: its EOS is the one that ends the documents."""
    return replace(meta, eos_id=meta.eos_id if framing.eos_id is None else framing.eos_id, framing=framing)


def _bos(cfg: ResolvedConfig, tok: Tokenizer, prefix: tuple[int, ...]) -> int | None:
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


def _eos(cfg: ResolvedConfig, tok: Tokenizer, suffix: tuple[int, ...]) -> int:
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
