"""The settings of a `dataflow tokenize` run (`TokenizeConfig`): what they are, which of them change the
output bytes (`output_settings`: a rerun must match them to resume), and the checks that refuse settings that
cannot work."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from dataflow.debug import cause
from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.remote_errors import missing_backend
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, check_shard_size, check_zstd_level, parse_size
from dataflow.preprocess.executors import check_executor
from dataflow.preprocess.journal import input_digest
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES
from dataflow.tokenizers.tiktoken_files import split_spec, tiktoken_spec

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
    eos: bool = True
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
    stamp = None
    if "://" not in path:
        try:
            st = os.stat(path)
        except OSError:
            return spec
        stamp = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    digest = _content_sha256(path, stamp)
    return f"{prefix}sha256:{digest}" if digest else spec


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

