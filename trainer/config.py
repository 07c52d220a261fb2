"""The trainer's configuration: one dataclass per TOML section, read from a file plus `--set` overrides.

Every key is typed by its dataclass field; an unknown section or key, a value of the wrong type or an
out-of-range choice raises `dataflow.ConfigError` naming the key, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

from dataflow.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass
class DataConfig:
    path: str = ""  # dataset folder/URL written by `dataflow tokenize` (the train split)
    val_path: str = ""  # optional validation dataset, evaluated every train.eval_every steps
    seq_len: int = 1024
    batch_size: int = 8  # per process, per micro-step
    num_workers: int = 2
    shuffle_window: int = 8  # shards shuffled together
    doc_mask: bool = False  # attention restricted to each document (position_ids restart per document)
    prefetch_depth: int = 2  # batches the DevicePrefetcher keeps ahead
    audit: str = ""  # a folder: each rank records the samples it served; `dataflow audit DIR` checks every one once


@dataclass
class ModelConfig:
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    vocab_multiple: int = 64  # the embedding is padded to a multiple of this (faster matmuls)
    init_std: float = 0.02


@dataclass
class TrainConfig:
    steps: int = 1000
    grad_accum: int = 1  # micro-batches per step: a step is the mean over batch_size x grad_accum samples, the
    # same samples as batch_size x grad_accum in one batch except at an epoch's end (each micro-batch is a batch of
    # the loader, and the loader drops the epoch's partial last batch of batch_size)
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant, from lr after warmup down to min_lr at `steps`
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still logged)
    precision: str = "bf16"  # fp32 | bf16
    parallel: str = "ddp"  # ddp | fsdp | hsdp (a single process runs the plain model)
    hsdp_replicas: int = 0  # hsdp: replica groups (0: one per node, from torchrun's LOCAL_WORLD_SIZE, after tp and pp)
    tensor_parallel: int = 1  # ranks splitting each layer's heads and MLP (and the vocabulary): fsdp/hsdp only
    pipeline_parallel: int = 1  # stages splitting the layers (fsdp/hsdp only; 1F1B over the micro-batches)
    global_batch_tokens: int = 0  # > 0: tokens per optimizer step, whatever the layout; decides grad_accum from
    # data.batch_size and the data-parallel size (train.grad_accum is then ignored), and refuses a layout that
    # cannot give it exactly; 0: batch_size x seq_len x grad_accum x data-parallel ranks
    batch_check_every: int = 100  # every N steps (and at the first), the ranks of a tensor-parallel group compare a
    # hash of their batch and stop in one line if it differs; 0 disables
    ddp_comm_hook: str = "none"  # none | bf16 | powersgd
    powersgd_rank: int = 1
    compile: bool = False
    activation_checkpointing: bool = False
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    max_bad_steps: int = 10  # abort after this many non-finite steps in a row
    spike_factor: float = 3.0  # a loss above spike_factor x its running average is a spike; 0 disables
    spike_rollback: bool = False  # on a spike, reload the last checkpoint and skip the offending data
    eval_every: int = 0  # validation every N steps when data.val_path is set; 0: only at the end
    eval_batches: int = 20
    stop_at: int = 0  # leave after this step (saving a checkpoint) while keeping the schedule of `steps`
    inject_nan_step: int = 0  # test hook: poison the loss of this step with NaN


@dataclass
class CheckpointConfig:
    dir: str = ""  # empty: no checkpoints
    every: int = 200
    keep: int = 3  # complete checkpoints kept; older ones are deleted
    resume: str = "auto"  # auto (newest complete checkpoint in dir, if any) | none | a checkpoint folder
    # dir is one run's: a new run refuses another run's checkpoints there (and a resumed one its checkpoints past
    # the one it resumes from) unless replace = true, which deletes them when the run starts
    replace: bool = False
    save_at_exit: bool = True  # also at the end of the run and on SIGTERM/SIGINT


@dataclass
class LogConfig:
    every: int = 10
    jsonl: str = ""  # metrics records, one JSON object a line (appended)
    tensorboard: str = ""  # a log dir; used when tensorboard is installed
    # each rank's data-wait figures for `dataflow profile --fleet DIR` ("": the folder `ranks` beside log.jsonl,
    # when jsonl is set; "none": not written); rank 0 names stragglers at each log interval and sums up the fleet
    run_dir: str = ""


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    ("train", "decay"): ("cosine", "linear", "constant"),
    ("train", "precision"): ("fp32", "bf16"),
    ("train", "parallel"): ("ddp", "fsdp", "hsdp"),
    ("train", "ddp_comm_hook"): ("none", "bf16", "powersgd"),
    ("train", "device"): ("auto", "cpu", "cuda"),
}
POSITIVE = {("data", "seq_len"), ("data", "batch_size"), ("data", "prefetch_depth"), ("data", "shuffle_window"),
            ("model", "n_layer"), ("model", "n_head"), ("model", "d_model"), ("model", "vocab_multiple"),
            ("model", "mlp_ratio"), ("model", "rope_theta"), ("model", "norm_eps"), ("model", "init_std"),
            ("train", "steps"), ("train", "grad_accum"), ("train", "max_bad_steps"), ("train", "eval_batches"),
            ("train", "tensor_parallel"), ("train", "pipeline_parallel"),
            ("checkpoint", "every"), ("checkpoint", "keep"), ("log", "every")}
NON_NEGATIVE = {("data", "num_workers"), ("train", "warmup_steps"), ("train", "lr"), ("train", "min_lr"),
                ("train", "weight_decay"), ("train", "clip"), ("train", "spike_factor"), ("train", "eval_every"),
                ("train", "stop_at"), ("train", "hsdp_replicas"), ("train", "inject_nan_step"),
                ("train", "global_batch_tokens"), ("train", "batch_check_every"),
                ("model", "dropout")}


def _section_types(section: Any) -> dict[str, type]:
    return typing.get_type_hints(type(section))


def _coerce(where: str, value: Any, kind: type, origin: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}{origin}")
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # `--set data.path=123` names a folder called 123
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where} must be {kind.__name__}, got {type(value).__name__} {value!r}{origin}")
    return value


def apply(cfg: Config, section: str, key: str, value: Any, source: str = "") -> None:
    """Set `section.key = value` with type checking; `source` names where the value came from."""
    sections = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    origin = f" (in {source})" if source else ""
    if section not in sections:
        raise ConfigError(f"unknown config section [{section}]{origin}; known: {', '.join(sections)}")
    obj = sections[section]
    types = _section_types(obj)
    if key not in types:
        raise ConfigError(f"unknown config key {section}.{key}{origin}; known keys of [{section}]: "
                          f"{', '.join(types)}")
    setattr(obj, key, _coerce(f"{section}.{key}", value, types[key], origin))


def validate(cfg: Config) -> None:
    """Range and choice checks across the whole config."""
    for (section, key), allowed in CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in allowed:
            raise ConfigError(f"{section}.{key} = {value!r} is not one of {', '.join(allowed)}")
    for section, key in POSITIVE:
        if getattr(getattr(cfg, section), key) <= 0:
            raise ConfigError(f"{section}.{key} must be positive, got {getattr(getattr(cfg, section), key)}")
    for section, key in NON_NEGATIVE:
        if getattr(getattr(cfg, section), key) < 0:
            raise ConfigError(f"{section}.{key} must not be negative, got {getattr(getattr(cfg, section), key)}")
    if cfg.model.d_model % cfg.model.n_head or (cfg.model.d_model // cfg.model.n_head) % 2:
        raise ConfigError(f"model.d_model ({cfg.model.d_model}) must split into model.n_head ({cfg.model.n_head}) "
                          f"heads of even size (RoPE rotates pairs)")
    if not 0 <= cfg.model.dropout < 1:
        raise ConfigError(f"model.dropout must be in [0, 1), got {cfg.model.dropout}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(cfg.train, key) < 1:
            raise ConfigError(f"train.{key} must be in [0, 1) (AdamW's moment decay), got {getattr(cfg.train, key)}")
    if not cfg.train.eps > 0:
        raise ConfigError(f"train.eps must be positive (AdamW's denominator term), got {cfg.train.eps}")
    if cfg.train.min_lr > cfg.train.lr:
        raise ConfigError(f"train.min_lr ({cfg.train.min_lr}) is above train.lr ({cfg.train.lr})")
    if not cfg.data.path:
        raise ConfigError("data.path is empty; set it in the config or with --set data.path=DATASET")


def parse_value(text: str) -> Any:
    """A `--set` value: a TOML literal (`3`, `1e-4`, `true`, `"x"`), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


# keys whose values are paths: relative ones in a config file are read against the file's own folder
PATH_KEYS = (("data", "path"), ("data", "val_path"), ("checkpoint", "dir"), ("checkpoint", "resume"),
             ("log", "jsonl"), ("log", "tensorboard"), ("data", "audit"), ("log", "run_dir"))


def builtin_configs() -> dict[str, str]:
    """Name -> path of the configs that ship with the trainer: `configs/` in a clone, `trainer/configs`
    (the same files) in an installed package."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.join(os.path.dirname(here), "configs"), os.path.join(here, "configs")]
    found: dict[str, str] = {}
    for folder in folders:
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                if name.endswith(".toml"):
                    found.setdefault(name[: -len(".toml")], os.path.join(folder, name))
    return found


def find_config(spec: str) -> tuple[str, str | None]:
    """(file, folder that relative paths in it are read against) for `--config SPEC`.

    SPEC is a TOML file's path or a built-in config's name (`demo`). The built-in configs are templates:
    their relative paths (`demo-out/checkpoints`) are read against the working directory, whether named or
    given by path; any other config file reads its relative paths against its own folder, wherever it runs.
    """
    builtin = builtin_configs()
    if os.path.isfile(spec):
        shipped = {os.path.realpath(p) for p in builtin.values()}
        return spec, None if os.path.realpath(spec) in shipped else os.path.dirname(os.path.abspath(spec))
    name = spec[: -len(".toml")] if spec.endswith(".toml") else spec
    if os.sep not in spec and name in builtin:
        return builtin[name], None
    raise ConfigError(f"config file {spec} does not exist and is not a built-in config (built-in: "
                      f"{', '.join(builtin) or 'none found'}; e.g. --config demo)")


def _resolve_paths(cfg: Config, base: str) -> None:
    for section, key in PATH_KEYS:
        value = getattr(getattr(cfg, section), key)
        keyword = ((section, key) == ("checkpoint", "resume") and value in ("auto", "none")
                   or (section, key) == ("log", "run_dir") and value == "none")
        if value and not keyword and "://" not in value and not os.path.isabs(value):
            setattr(getattr(cfg, section), key, os.path.normpath(os.path.join(base, value)))


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                check: bool = True) -> Config:
    """Defaults, then the TOML file at `path` (a path or a built-in name, see `find_config`), then each
    `section.key=value` override, then validation. Relative paths in a config file are read against the
    file's folder; those of a built-in config and of overrides against the working directory."""
    cfg = Config()
    if path:
        path, base = find_config(path)
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
        for section, table in doc.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [section] table")
            for key, value in table.items():
                apply(cfg, section, key, value, source=path)
        if base is not None:
            _resolve_paths(cfg, base)
    for item in overrides:
        name, sep, text = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(f"--set {item!r}: write it as section.key=value, e.g. --set train.steps=100")
        apply(cfg, section, key, parse_value(text.strip()), source="--set")
    if check:
        validate(cfg)
    return cfg


def rank_figures_dir(cfg: Config) -> str | None:
    """Where each rank writes its figures for the fleet view: log.run_dir, else `ranks` beside log.jsonl."""
    if cfg.log.run_dir == "none":
        return None
    if cfg.log.run_dir:
        return cfg.log.run_dir
    return os.path.join(os.path.dirname(cfg.log.jsonl) or ".", "ranks") if cfg.log.jsonl else None
